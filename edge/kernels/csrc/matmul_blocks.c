/* The matmul over llama.cpp's block formats (blocks.h), activations quantized to 8 bits as llama.cpp does:
 *
 *   32-weight types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): each row per block of 32, one scale sx = max|x| / 127 rounded
 *       to float16, and for Q4_1 / Q5_1 sxsum = float16(xsum * max|x| / 127) (llama.cpp's Q8_0 / Q8_1 activations)
 *   k-quants (Q4_K, Q5_K, Q6_K): each row per block of 256, one scale, and the codes' sums per 16 and per 32
 *       (llama.cpp's Q8_K)
 *
 * Per output n, row m and block b, an exact integer dot of the codes, then float32 steps in one fixed order:
 *
 *   Q8_0        acc += (float)dot * (d sx)
 *   Q4_0, Q5_0  acc += (float)(dot - o xsum) * (d sx)                   o = 8, 16
 *   Q4_1, Q5_1  acc += (float)dot * (d sx) + m sxsum
 *   Q4_K, Q5_K  acc += (float)(sum_j sc_j dot_j) * (d sx) - (float)(sum_j m_j xsum_j) * (dmin sx)
 *   Q6_K        acc += (float)(sum_j sc_j (dot_j - 32 xsum_j)) * (d sx)
 *
 * each product and sum rounded to float32 (no fused multiply-add), then + bias. The integer sums are exact on every
 * path and the float steps are lane-wise in the same order, so every path gives the same bits, and a row's result
 * never depends on the other rows of the call: a verify pass reproduces decode steps exactly.
 *
 * A path works on LANES outputs at a time (16 with AVX-512 VNNI, 8 with AVX2 and NEON, 4 portable: a group of 16 in
 * several passes over the same bytes, the later ones from cache), with simd.h's integer lane primitives:
 *   lb   LANES * 4 bytes: a chunk, a pair or a plane's share for the pass
 *   lw   partial integer dots: int16 pairs on AVX2 (vpmaddubsw, widened every few chunks before they could
 *        overflow), int32 elsewhere (vpdpbusd, sdot)
 *   li   LANES int32: exact dots;  lf  LANES float32
 */
#include <omp.h>
#include <stdlib.h>

#include "blocks.h"
#include "quantized.h"

#define MAX_ROWS (LANES == 16 ? 8 : 4)  /* rows a tile walks the weights once for: AVX-512's 32 registers hold 8 */
#define SPAN_BYTES 65536  /* a prompt's tiles of rows share this much of the weights at a time (in L2) */

#define STEP (LANES * 4) /* bytes of a 64-byte chunk, pair or plane that one pass reads */

/* ---- activations ---- */

/* A row's codes and per-block numbers, as one format's tiles read them */
typedef struct {
    const int8_t *codes;        /* K, padded to whole blocks */
    const float *scales;        /* per block: sx (32-weight types) or per 256 (k-quants) */
    const int32_t *sums;        /* 32-weight types: per 32; k-quants: per 16 */
    const int32_t *pairs;       /* k-quants: the sums per 32 of sub-blocks 2i and 2i + 1 as int16 halves of word i */
    const int32_t *centred;     /* k-quants: 32 * the sums per 16 (Q6_K's codes q - 32) */
    const float *scaled_sums;   /* 32-weight types: float16(sx * sum) per 32 (Q4_1, Q5_1 min term) */
} Row;

/* The prepared buffer: the rows at both granularities (a matrix's segments may want either), each: codes (M, K),
 * then per-block numbers */
typedef struct {
    int8_t *codes;
    float *scales;
    int32_t *sums;
    int32_t *pairs;
    int32_t *centred;
    float *scaled_sums;
} Prepared;

static int64_t aligned(int64_t bytes) { return round_up(bytes, 64); }

/* A row's width in whole blocks of the granularity (a matrix whose width is not a multiple takes zero weights and
 * zero activations past it) */
static int64_t padded(int64_t K, int wide) { return round_up(K, wide ? 256 : 32); }

static Prepared prepared_at(void *base, int64_t M, int64_t K, int wide) {
    const int64_t K32 = padded(K, 0), Kp = padded(K, wide);
    uint8_t *p = base;
    if (wide) p += aligned(M * K32) + aligned(M * (K32 / 32) * 12);  /* after the 32-weight granularity */
    Prepared out;
    out.codes = (int8_t *)p;
    p += aligned(M * Kp);
    if (!wide) {
        out.scales = (float *)p;
        out.sums = (int32_t *)(out.scales + M * (Kp / 32));
        out.scaled_sums = (float *)(out.sums + M * (Kp / 32));
        out.pairs = out.centred = NULL;
    } else {
        out.scales = (float *)p;
        p += aligned(M * (Kp / 256) * 4);
        out.sums = (int32_t *)p;
        out.pairs = out.sums + M * (Kp / 16);
        out.centred = out.pairs + M * (Kp / 64);
        out.scaled_sums = NULL;
    }
    return out;
}

static int64_t activation_bytes(int64_t M, int64_t K) {
    const int64_t K32 = padded(K, 0), K256 = padded(K, 1);
    return aligned(M * K32) + aligned(M * (K32 / 32) * 12) + aligned(M * K256) + aligned(M * (K256 / 256) * 4) +
           aligned(M * (2 * (K256 / 16) + K256 / 64) * 4);
}

/* the rows at both granularities, then one counter per segment (each on its own cache line): the chunks of output
 * groups the team's threads have taken */
int64_t blocks_prepared_bytes(int64_t M, int64_t K) { return activation_bytes(M, K) + 64 * BLOCKS_MAX_SEGMENTS; }

static int64_t *taken_counter(void *prepared, int64_t M, int64_t K, int segment) {
    return (int64_t *)((uint8_t *)prepared + activation_bytes(M, K) + 64 * segment);
}

static Row row_of(const Prepared *p, int64_t m, int64_t K, int wide) {
    const int64_t Kp = padded(K, wide);
    Row row = {p->codes + m * Kp, NULL, NULL, NULL, NULL, NULL};
    if (!wide) {
        row.scales = p->scales + m * (Kp / 32);
        row.sums = p->sums + m * (Kp / 32);
        row.scaled_sums = p->scaled_sums + m * (Kp / 32);
    } else {
        row.scales = p->scales + m * (Kp / 256);
        row.sums = p->sums + m * (Kp / 16);
        row.pairs = p->pairs + m * (Kp / 64);
        row.centred = p->centred + m * (Kp / 16);
    }
    return row;
}

/* This thread's part of quantizing M rows at the granularity `wide` selects, blocks split evenly, as llama.cpp
 * quantizes activations (codes round(x * 127 / max|x|), ties to even; quantized.h gives the same codes on every
 * path):
 *   per 32 (its Q8_0 / Q8_1): the scale max|x| / 127 rounded to float16, and float16(sum * max|x| / 127)
 *   per 256 (its Q8_K): the scale 1 / (127 / max|x|), and the codes' sums per 16 (and per 32 here, two to a word:
 *   each at most 32 * 127 in magnitude) */
static void prepare_share(const float *x, int64_t M, int64_t K, const Prepared *p, int wide, int part, int parts) {
    const int64_t B = wide ? 256 : 32, Kp = padded(K, wide), blocks = Kp / B, total = M * blocks;
    for (int64_t i = total * part / parts; i < total * (part + 1) / parts; i++) {
        const int64_t m = i / blocks, b = i % blocks, width = K - b * B < B ? K - b * B : B;
        int8_t *codes = p->codes + m * Kp + b * B;
        int32_t sum;
        const float top = quantize_codes(x + m * K + b * B, codes, width, &sum);
        memset(codes + width, 0, B - width);  /* past a width that is not whole blocks */
        if (!wide) {
            p->scales[i] = f16_to_f32(half_bits(top / 127.0f));
            p->sums[i] = sum;
            p->scaled_sums[i] = f16_to_f32(half_bits((float)sum * (top / 127.0f)));
        } else {
            p->scales[i] = top > 0.0f ? 1.0f / (127.0f / top) : 0.0f;
            for (int j = 0; j < 16; j++) {
                int32_t run = 0;
                for (int l = 0; l < 16; l++) run += codes[16 * j + l];
                p->sums[i * 16 + j] = run;
                p->centred[i * 16 + j] = 32 * run;
            }
            for (int j = 0; j < 4; j++) {
                const int32_t first = p->sums[i * 16 + 4 * j] + p->sums[i * 16 + 4 * j + 1];
                const int32_t second = p->sums[i * 16 + 4 * j + 2] + p->sums[i * 16 + 4 * j + 3];
                p->pairs[i * 4 + j] = (int32_t)(((uint32_t)second << 16) | ((uint32_t)first & 0xFFFF));
            }
        }
    }
}

/* ---- one run of codes: pairs of nibbles (and plane bits) against R rows ---- */

/* dots[r] += the exact dots of a run of `pairs` pairs at `at` (plane at `plane`: `bits` 0, 1 or 2 higher bits per
 * code) with each row's codes x[r], times `multiplier` per output when `scaled`. AVX2's int16 partial dots are widened
 * every `every` pairs, before they could overflow (4 pairs of 4-bit codes: 16 products of at most 15 * 127). With
 * `centred` rows (int32 partials only: one widening per run), each row's run dot has 32 * its codes' sum
 * (rows[r].centred[index]) taken off before it is scaled: Q6_K's codes q - 32. */
ALWAYS void run_dots(const uint8_t *at, const uint8_t *plane_at, const int pairs, const int bits,
                     const int8_t *const x[MAX_ROWS], li dots[MAX_ROWS], li multiplier, const int scaled,
                     const Row *centred, int64_t index, const int R) {
    const int every = WIDE_LW ? pairs : bits == 0 ? 4 : bits == 1 ? 2 : 1;
    lw part[MAX_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) part[r] = lw_zero();
    lb plane;
    if (bits) plane = lb_load(plane_at);
    _Pragma("GCC unroll 4") for (int p = 0; p < pairs; p++) {
        const lb v = lb_load(at + 64 * p);
        lb lo = lb_low(v), hi = lb_high(v);
        if (bits == 1) {  /* chunk c's bit c of the plane to bit 4 */
            lo = lb_merge(lo, plane, 4 - 2 * p, 0x10);
            hi = lb_merge(hi, plane, 3 - 2 * p, 0x10);
        } else if (bits == 2) {  /* chunk c's bits 2c, 2c + 1 to bits 4, 5 */
            lo = lb_merge(lo, plane, 4 - 4 * p, 0x30);
            hi = lb_merge(hi, plane, 2 - 4 * p, 0x30);
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            part[r] = lw_dot(lw_dot(part[r], lo, x[r] + 8 * p), hi, x[r] + 8 * p + 4);
            pin_register(part[r]);  /* simd.h: a chain, not a tree of partial sums spilled to the stack */
        }
        if ((p + 1) % every == 0 || p + 1 == pairs)
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                if (WIDE_LW && centred) part[r] = li_sub(part[r], li_set(centred[r].centred[index]));
                dots[r] = scaled ? li_widen_by(dots[r], part[r], multiplier) : li_widen(dots[r], part[r]);
                part[r] = lw_zero();
            }
    }
}

/* Run `run` of `runs`' share of the lines of a block's `bytes` at g, asked for PREFETCH_AHEAD bytes early: spread over
 * the block's runs, so that the requests in flight never outnumber what the core can track (a burst of a block's 36
 * lines stalls it) */
ALWAYS void prefetch_share(const uint8_t *g, int64_t bytes, int run, int runs) {
    const int64_t lines = (bytes + 63) / 64;
    for (int64_t line = lines * run / runs; line < lines * (run + 1) / runs; line++) prefetch_ahead(g + 64 * line);
}

/* ---- one block of a group (this pass's LANES outputs of it) against R rows: sums[r] += its terms ---- */

ALWAYS void block_32(const int format, const uint8_t *g, const Row *rows, int64_t b, lf sums[MAX_ROWS], const int R,
                     const int h) {
    li dots[MAX_ROWS];
    const int8_t *x[MAX_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) dots[r] = li_zero(), x[r] = rows[r].codes + 32 * b;
    const int five = format == BLOCKS_Q5_0 || format == BLOCKS_Q5_1;
    const int minned = format == BLOCKS_Q4_1 || format == BLOCKS_Q5_1;
    const Fields32 f = fields_32(format, g);  /* blocks.h */
    if (format == BLOCKS_Q8_0) {
        _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {
            const lb w = lb_q8(lb_load(f.codes + 64 * c + STEP * h));
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) dots[r] = li_dot_q8(dots[r], w, x[r] + 4 * c);
        }
    } else {
        run_dots(f.codes + STEP * h, five ? f.plane + STEP * h : NULL, 4, five, x, dots, li_zero(), 0, NULL, 0, R);
    }
    const lf d = lf_f16(f.d + LANES * h);
    const lf m = minned ? lf_f16(f.m + LANES * h) : lf_zero();
    const int offset = format == BLOCKS_Q8_0 ? 128 * Q8_FLIPPED : format == BLOCKS_Q4_0 ? 8 : format == BLOCKS_Q5_0 ? 16 : 0;
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        const li exact = offset ? li_sub(dots[r], li_set(offset * rows[r].sums[b])) : dots[r];
        lf term = lf_mul(lf_of(exact), lf_mul(d, lf_set(rows[r].scales[b])));
        if (minned) term = lf_add(term, lf_mul(m, lf_set(rows[r].scaled_sums[b])));
        sums[r] = lf_add(sums[r], term);
    }
}

ALWAYS void block_k(const int format, const uint8_t *g, const Row *rows, int64_t b, lf sums[MAX_ROWS], const int R,
                    const int h) {
    li dots[MAX_ROWS], offsets[MAX_ROWS];
    const int8_t *x[MAX_ROWS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) dots[r] = offsets[r] = li_zero();
    const int six = format == BLOCKS_Q6_K, five = format == BLOCKS_Q5_K;
    const FieldsK f = fields_k(format, g);  /* blocks.h */
    const int64_t bytes = block_group_bytes(format), runs = six ? 16 : 8;
    if (six) {
        for (int j = 0; j < 16; j++) {  /* runs of 16: dots[r] += sc_j (dot_j - 32 xsum_j) */
            prefetch_share(g, bytes, h * runs + j, (BLOCKS_GROUP / LANES) * runs);
            const li scale = li_multiplier(f.scales + BLOCKS_GROUP * j + LANES * h, 1);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
                x[r] = rows[r].codes + 256 * b + 16 * j;
                if (!WIDE_LW)  /* int16 partial dots are scaled pair by pair: the offset apart, sc_j xsum_j */
                    offsets[r] = li_add(offsets[r], li_times(scale, rows[r].sums[16 * b + j]));
            }
            run_dots(run_pairs(format, g, j) + STEP * h, run_plane(format, g, j) + STEP * h, 2, 2, x, dots, scale, 1,
                     WIDE_LW ? rows : NULL, 16 * b + j, R);
        }
    } else {
        for (int j = 0; j < 8; j++) {  /* runs of 32: dots[r] += sc_j dot_j */
            prefetch_share(g, bytes, h * runs + j, (BLOCKS_GROUP / LANES) * runs);
            const li scale = li_multiplier(f.scales + BLOCKS_GROUP * j + LANES * h, 0);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) x[r] = rows[r].codes + 256 * b + 32 * j;
            run_dots(run_pairs(format, g, j) + STEP * h, five ? run_plane(format, g, j) + STEP * h : NULL, 4, five, x,
                     dots, scale, 1, NULL, 0, R);
        }
        for (int i = 0; i < 4; i++)  /* offsets[r] = sum_j m_j xsum_j, two sub-blocks at a time */
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
                offsets[r] = li_pair_dot(offsets[r], f.mins + 2 * BLOCKS_GROUP * i + 2 * LANES * h,
                                         rows[r].pairs[4 * b + i]);
    }
    const lf d = lf_f16(f.d + LANES * h);
    const lf dmin = six ? lf_zero() : lf_f16(f.dmin + LANES * h);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        const lf sx = lf_set(rows[r].scales[b]);
        const lf term = six ? lf_mul(lf_of(li_sub(dots[r], li_shl(offsets[r], 5))), lf_mul(d, sx))
                            : lf_sub(lf_mul(lf_of(dots[r]), lf_mul(d, sx)), lf_mul(lf_of(offsets[r]), lf_mul(dmin, sx)));
        sums[r] = lf_add(sums[r], term);
    }
}

/* ---- a group of 16 outputs against R rows, and the matmul ---- */

/* acc[r][0 .. 16) over all blocks of one group (`blocks` blocks of the format at `weights`), R rows: each block's
 * bytes read once from memory, every pass over them (LANES outputs each) while they are in the L1 cache, so the
 * prefetches run ahead through the whole group */
ALWAYS void group_tile(const int format, const Row *rows, const uint8_t *weights, int64_t blocks,
                       float acc[MAX_ROWS][BLOCKS_GROUP], const int R) {
    const int64_t bytes = block_group_bytes(format);
    lf sums[BLOCKS_GROUP / LANES][MAX_ROWS];
    for (int h = 0; h < BLOCKS_GROUP / LANES; h++)
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sums[h][r] = lf_zero();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *g = weights + b * bytes;
        _Pragma("GCC unroll 4") for (int h = 0; h < BLOCKS_GROUP / LANES; h++) {
            if (blocks_k_quant(format)) {
                block_k(format, g, rows, b, sums[h], R, h);  /* asks for its lines run by run */
            } else {
                prefetch_share(g, bytes, h, BLOCKS_GROUP / LANES);
                block_32(format, g, rows, b, sums[h], R, h);
            }
        }
    }
    for (int h = 0; h < BLOCKS_GROUP / LANES; h++)
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) lf_store(acc[r] + LANES * h, sums[h][r]);
}

/* y[r * ldy + n0 + lane] = acc[r][lane] (+ bias) for the group's outputs below N */
static void store_group(float acc[MAX_ROWS][BLOCKS_GROUP], const float *bias, float *y, int64_t ldy, int64_t N,
                        int64_t n0, int R) {
    for (int r = 0; r < R; r++)
        for (int lane = 0; lane < BLOCKS_GROUP && n0 + lane < N; lane++)
            y[r * ldy + n0 + lane] = bias ? acc[r][lane] + bias[n0 + lane] : acc[r][lane];
}

/* Groups [begin, end) of one format for rows m .. m + R - 1 */
ALWAYS void rows_tile_of(const int format, const Prepared *p, const uint8_t *packed, const float *bias, float *y,
                         int64_t ldy, int64_t m, const int R, int64_t begin, int64_t end, int64_t N, int64_t K) {
    const int wide = blocks_k_quant(format);
    const int64_t blocks = padded(K, wide) / block_weights(format), bytes = blocks * block_group_bytes(format);
    Row rows[MAX_ROWS];
    for (int r = 0; r < R; r++) rows[r] = row_of(p, m + r, K, wide);
    float acc[MAX_ROWS][BLOCKS_GROUP];
    for (int64_t group = begin; group < end; group++) {
        group_tile(format, rows, packed + group * bytes, blocks, acc, R);
        store_group(acc, bias, y + m * ldy, ldy, N, group * BLOCKS_GROUP, R);
    }
}

/* each format's tiles compiled with the format a constant (5-8 rows where MAX_ROWS is 8) */
#if LANES == 16
#define WIDER_TILES(FORMAT)                                                                                        \
    case 5: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 5, begin, end, N, K); break;                          \
    case 6: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 6, begin, end, N, K); break;                          \
    case 7: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 7, begin, end, N, K); break;                          \
    default: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 8, begin, end, N, K); break;
#else
#define WIDER_TILES(FORMAT)
#endif
#define FORMAT_TILES(NAME, FORMAT)                                                                                 \
    static void NAME(const Prepared *p, const uint8_t *packed, const float *bias, float *y, int64_t ldy, int64_t m, \
                     int R, int64_t begin, int64_t end, int64_t N, int64_t K) {                                    \
        switch (R) {                                                                                               \
            case 1: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 1, begin, end, N, K); break;                   \
            case 2: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 2, begin, end, N, K); break;                   \
            case 3: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 3, begin, end, N, K); break;                   \
            case 4: rows_tile_of(FORMAT, p, packed, bias, y, ldy, m, 4, begin, end, N, K); break;                   \
            WIDER_TILES(FORMAT)                                                                                    \
        }                                                                                                          \
    }
FORMAT_TILES(tiles_q8_0, BLOCKS_Q8_0)
FORMAT_TILES(tiles_q4_0, BLOCKS_Q4_0)
FORMAT_TILES(tiles_q4_1, BLOCKS_Q4_1)
FORMAT_TILES(tiles_q5_0, BLOCKS_Q5_0)
FORMAT_TILES(tiles_q5_1, BLOCKS_Q5_1)
FORMAT_TILES(tiles_q4_k, BLOCKS_Q4_K)
FORMAT_TILES(tiles_q5_k, BLOCKS_Q5_K)
FORMAT_TILES(tiles_q6_k, BLOCKS_Q6_K)

typedef void (*Tiles)(const Prepared *, const uint8_t *, const float *, float *, int64_t, int64_t, int, int64_t,
                      int64_t, int64_t, int64_t);
static Tiles tiles_of(int format) {
    switch (format) {
        case BLOCKS_Q8_0: return tiles_q8_0;
        case BLOCKS_Q4_0: return tiles_q4_0;
        case BLOCKS_Q4_1: return tiles_q4_1;
        case BLOCKS_Q5_0: return tiles_q5_0;
        case BLOCKS_Q5_1: return tiles_q5_1;
        case BLOCKS_Q4_K: return tiles_q4_k;
        case BLOCKS_Q5_K: return tiles_q5_k;
        default: return tiles_q6_k;
    }
}

/* This thread's part of one segment (N outputs in `format`) from prepared rows: a contiguous share of the first
 * seven eighths of the output groups (one long stream of weights per thread), then chunks of the rest taken from a
 * shared counter until none are left, so that a thread slowed by the other's memory traffic or an interrupt does
 * not hold the other at the next barrier. Which thread computes a group changes nothing in it. Up to MAX_ROWS rows
 * (8 with AVX-512, 4 elsewhere) take a range's groups in one sweep; more (a prompt) go MAX_ROWS at a time over a span
 * of groups kept in cache meanwhile
 * (SPAN_BYTES of them, or one group where K is long). */
static void segment_share(int format, const Prepared *p, const uint8_t *packed, const float *bias, float *y,
                          int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t *taken, int part, int parts) {
    const Tiles tiles = tiles_of(format);
    const int64_t groups = (N + BLOCKS_GROUP - 1) / BLOCKS_GROUP, shared = parts > 1 ? groups / 8 : 0;
    const int64_t group_bytes = padded(K, blocks_k_quant(format)) / block_weights(format) * block_group_bytes(format);
    const int64_t span = M <= MAX_ROWS ? groups : SPAN_BYTES / group_bytes > 1 ? SPAN_BYTES / group_bytes : 1;
    const int64_t own = groups - shared, chunk = shared / (4 * parts) > 1 ? shared / (4 * parts) : 1;
    int64_t first = own * part / parts, end = own * (part + 1) / parts;
    for (;;) {
        for (int64_t from = first; from < end; from += span)
            for (int64_t m = 0; m < M; m += MAX_ROWS)
                tiles(p, packed, bias, y, ldy, m, M - m < MAX_ROWS ? (int)(M - m) : MAX_ROWS, from,
                      end - from < span ? end : from + span, N, K);
        first = own + __atomic_fetch_add(taken, 1, __ATOMIC_RELAXED) * chunk;
        if (first >= groups) break;
        end = groups - first < chunk ? groups : first + chunk;
    }
}

/* The whole team's matmul x (M, K) -> y (M, N) through a BlockMatrix (+ bias (N)): the team quantizes the rows at
 * the granularities the segments need, waits, and the threads share out every segment's groups. The caller waits
 * for y (matmul.c team_matmul). */
void blocks_matmul_team(const float *x, const BlockMatrix *matrix, const float *bias, float *y, int64_t M, int64_t N,
                        int64_t K, void *prepared, int part, int parts) {
    int narrow = 0, wide = 0;
    for (int s = 0; s < matrix->count; s++) {
        if (matrix->formats[s] >= BLOCKS_Q4_K) wide = 1;
        else narrow = 1;
    }
    const Prepared by32 = prepared_at(prepared, M, K, 0), by256 = prepared_at(prepared, M, K, 1);
    if (narrow) prepare_share(x, M, K, &by32, 0, part, parts);
    if (wide) prepare_share(x, M, K, &by256, 1, part, parts);
    if (part == 0)
        for (int s = 0; s < matrix->count; s++) *taken_counter(prepared, M, K, s) = 0;
#pragma omp barrier
    int64_t n0 = 0;
    for (int s = 0; s < matrix->count; n0 += matrix->rows[s], s++) {
        const int format = matrix->formats[s];
        if (blocks_float(format)) {
            const int kind = format == BLOCKS_F32 ? WEIGHTS_FLOAT32 : format == BLOCKS_F16 ? WEIGHTS_FLOAT16 : WEIGHTS_BFLOAT16;
            float_matmul_strided_share(kind, x, matrix->data[s], bias ? bias + n0 : NULL, y + n0, N, M,
                                       matrix->rows[s], K, part, parts);
            continue;
        }
        segment_share(format, blocks_k_quant(format) ? &by256 : &by32, matrix->data[s], bias ? bias + n0 : NULL,
                      y + n0, N, M, matrix->rows[s], K, taken_counter(prepared, M, K, s), part, parts);
    }
}
