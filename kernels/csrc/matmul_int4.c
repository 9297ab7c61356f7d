/* int4 weights in groups of 32 along k, activations quantized per block of 32 (w4a8):
 *
 *   y[m, n] = sum over blocks b, in order, of  (float)(dot_b[m, n] - 8 * xsum_b[m]) * (sw_b[n] * sx_b[m])  (+ bias[n])
 *
 * with dot_b the exact integer sum over the block's 32 k of xq[m, k] * u[n, k], u = code + 8 in [0, 15] the stored
 * nibble (code = round(w / sw) in [-8, 7]; kernels/cpu_matmul.py pack_int4), xsum_b the sum of the row's codes in
 * the block. The accumulation is float32 `acc = acc + f * s` (two roundings, no FMA), one lane per output, the same
 * operations on every path: like int8, a row's result is the same bits whatever shares the call, on every CPU.
 *
 * Layout (N' = N rounded up to 16, K' = K rounded up to 32, zero weights in the padding): for each group of 16
 * outputs and each block of 32 k, 288 bytes: 4 pairs of 64 bytes, then the 16 outputs' float16 scales. Chunk c
 * (c = 0..7) is k = 32b + 4c .. 32b + 4c + 3 for the 16 outputs in turn (64 nibbles, as int8's chunk); pair p holds
 * chunk 2p in the low nibbles of its 64 bytes and chunk 2p + 1 in the high ones. So a 64-byte pair unpacks (mask,
 * shift) into two chunks, and a chunk is what one dot instruction takes:
 *   avx512 with VNNI  vpdpbusd (nibbles unsigned, activations signed), 16 outputs
 *   avx2 (and avx512 without VNNI)  vpmaddubsw: int16 pairs summed over the block (at most 8 * 2 * 15 * 127 <
 *                     32768), then vpmaddwd into int32, 8 outputs
 *   neon with dotprod  sdot, 4 outputs; neon  smull then pairwise adds, 4 outputs;  portable  scalar
 */
#include <omp.h>
#include <stdlib.h>

#include "quantized.h"

#define GROUP 16
#define BLOCK 32
#define BLOCK_BYTES 288 /* 256 bytes of nibbles, 16 float16 scales */
#define MAX_ROWS 4
#define SPAN_BYTES 65536   /* a prompt's tiles of rows share this much of the weights at a time (in L2) */

/* A row quantized by blocks of 32: codes (K' bytes), each block's scale and 8 * the sum of its codes. */
typedef struct {
    const int8_t *codes;
    const float *scales;
    const int32_t *offsets;
} BlockRow;

#if defined(EDGE_X86)
/* A whole block of 32 floats, as quantize_codes computes it (the same max, product, rounding and clamp, so the same
 * codes), in registers: the four vectors are loaded once, their max reduced by shuffles, and the codes packed and
 * stored as one 32-byte vector. Returns max|x|; *sum gets the codes' sum. */
static inline float quantize_whole_block(const float *x, int8_t *codes, int32_t *sum) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v[4];
    for (int q = 0; q < 4; q++) v[q] = _mm256_loadu_ps(x + 8 * q);
    const __m256 tops = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude)),
                                      _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude)));
    __m128 top4 = _mm_max_ps(_mm256_castps256_ps128(tops), _mm256_extractf128_ps(tops, 1));
    top4 = _mm_max_ps(top4, _mm_movehl_ps(top4, top4));
    const float top = _mm_cvtss_f32(_mm_max_ss(top4, _mm_shuffle_ps(top4, top4, 1)));
    if (top == 0.0f) {
        memset(codes, 0, BLOCK);
        *sum = 0;
        return 0.0f;
    }
    const __m256 inverse = _mm256_set1_ps(127.0f / top);
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = codes_of8(v[i], inverse);  /* quantized.h */
    *sum = sum_of8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    /* packs work within 128-bit halves: the bytes come out as 4-element runs 0, 2, 4, 6, 1, 3, 5, 7 */
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)codes,
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return top;
}
#endif

/* A block's `width` floats x (at most 32) -> its 32 codes (zeros past width), scale and offset (8 * the codes' sum) */
static void quantize_block(const float *x, int64_t width, int8_t *codes, float *scale, int32_t *offset) {
#if defined(EDGE_X86)
    if (width == BLOCK) {
        int32_t sum;
        *scale = quantize_whole_block(x, codes, &sum) / 127.0f;
        *offset = 8 * sum;
        return;
    }
#endif
    memset(codes + width, 0, BLOCK - width);  /* the padding past K */
    int32_t sum;
    *scale = quantize_codes(x, codes, width, &sum) / 127.0f;
    *offset = 8 * sum;
}

static inline float scale_at(const uint8_t *block, int lane) {
    uint16_t bits;
    memcpy(&bits, block + 256 + 2 * lane, sizeof bits);
    return f16_to_f32(bits);
}

/* acc[r][lane] over all blocks of one output group `weights` (K'/32 blocks of 288 bytes), R rows. */
static inline __attribute__((always_inline)) void group_tile(const BlockRow *rows, const uint8_t *weights,
                                                            int64_t blocks, float acc[MAX_ROWS][GROUP], const int R) {
#if defined(EDGE_VNNI)
    __m512 sums[MAX_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sums[r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = weights + b * BLOCK_BYTES;
        for (int line = 0; line < BLOCK_BYTES; line += 64) prefetch_ahead(block + line);  /* simd.h */
        __m512i dots[MAX_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) dots[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m512i v = _mm512_loadu_si512((const void *)(block + 64 * p));
            const __m512i even = _mm512_and_si512(v, low), odd = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                int32_t quads[2];
                memcpy(quads, rows[r].codes + b * BLOCK + 8 * p, sizeof quads);
                dots[r] = _mm512_dpbusd_epi32(dots[r], even, _mm512_set1_epi32(quads[0]));
                dots[r] = _mm512_dpbusd_epi32(dots[r], odd, _mm512_set1_epi32(quads[1]));
            }
        }
        const __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 256)));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m512i exact = _mm512_sub_epi32(dots[r], _mm512_set1_epi32(rows[r].offsets[b]));
            const __m512 scale = _mm512_mul_ps(sw, _mm512_set1_ps(rows[r].scales[b]));
            sums[r] = _mm512_add_ps(sums[r], _mm512_mul_ps(_mm512_cvtepi32_ps(exact), scale));
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _mm512_storeu_ps(acc[r], sums[r]);
#elif defined(EDGE_X86)
    __m256 sums[MAX_ROWS][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sums[r][0] = sums[r][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = weights + b * BLOCK_BYTES;
        for (int line = 0; line < BLOCK_BYTES; line += 64) prefetch_ahead(block + line);  /* simd.h */
        __m256i pairs[MAX_ROWS][2];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) pairs[r][0] = pairs[r][1] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(block + 64 * p));
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(block + 64 * p + 32));
            const __m256i even0 = _mm256_and_si256(v0, low), odd0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
            const __m256i even1 = _mm256_and_si256(v1, low), odd1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                int32_t quads[2];
                memcpy(quads, rows[r].codes + b * BLOCK + 8 * p, sizeof quads);
                const __m256i xa = _mm256_set1_epi32(quads[0]), xb = _mm256_set1_epi32(quads[1]);
                pairs[r][0] = _mm256_add_epi16(pairs[r][0], _mm256_add_epi16(_mm256_maddubs_epi16(even0, xa),
                                                                             _mm256_maddubs_epi16(odd0, xb)));
                pairs[r][1] = _mm256_add_epi16(pairs[r][1], _mm256_add_epi16(_mm256_maddubs_epi16(even1, xa),
                                                                             _mm256_maddubs_epi16(odd1, xb)));
                pin_register(pairs[r][0]);
                pin_register(pairs[r][1]);
            }
        }
        const __m256 sw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 256)));
        const __m256 sw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 272)));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m256i offset = _mm256_set1_epi32(rows[r].offsets[b]);
            const __m256 sx = _mm256_set1_ps(rows[r].scales[b]);
            const __m256i exact0 = _mm256_sub_epi32(_mm256_madd_epi16(pairs[r][0], ones), offset);
            const __m256i exact1 = _mm256_sub_epi32(_mm256_madd_epi16(pairs[r][1], ones), offset);
            sums[r][0] = _mm256_add_ps(sums[r][0], _mm256_mul_ps(_mm256_cvtepi32_ps(exact0), _mm256_mul_ps(sw0, sx)));
            sums[r][1] = _mm256_add_ps(sums[r][1], _mm256_mul_ps(_mm256_cvtepi32_ps(exact1), _mm256_mul_ps(sw1, sx)));
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(acc[r], sums[r][0]);
        _mm256_storeu_ps(acc[r] + 8, sums[r][1]);
    }
#elif defined(EDGE_NEON)
    float32x4_t sums[MAX_ROWS][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) sums[r][q] = vdupq_n_f32(0.0f);
    const uint8x16_t low = vdupq_n_u8(0x0F);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = weights + b * BLOCK_BYTES;
        for (int line = 0; line < BLOCK_BYTES; line += 64) prefetch_ahead(block + line);  /* simd.h */
        int32x4_t dots[MAX_ROWS][4];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) dots[r][q] = vdupq_n_s32(0);
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            int32_t quads[MAX_ROWS][2];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                memcpy(quads[r], rows[r].codes + b * BLOCK + 8 * p, sizeof quads[r]);
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                const uint8x16_t v = vld1q_u8(block + 64 * p + 16 * q);  /* 4 outputs, both chunks */
                const int8x16_t even = vreinterpretq_s8_u8(vandq_u8(v, low));
                const int8x16_t odd = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
#if defined(EDGE_DOTPROD)
                    dots[r][q] = vdotq_s32(dots[r][q], even, vreinterpretq_s8_s32(vdupq_n_s32(quads[r][0])));
                    dots[r][q] = vdotq_s32(dots[r][q], odd, vreinterpretq_s8_s32(vdupq_n_s32(quads[r][1])));
#else
                    const int8x8_t xa = vreinterpret_s8_s32(vdup_n_s32(quads[r][0]));
                    const int8x8_t xb = vreinterpret_s8_s32(vdup_n_s32(quads[r][1]));
                    dots[r][q] = vpadalq_s16(dots[r][q], vpaddq_s16(vmull_s8(vget_low_s8(even), xa),
                                                                    vmull_s8(vget_high_s8(even), xa)));
                    dots[r][q] = vpadalq_s16(dots[r][q], vpaddq_s16(vmull_s8(vget_low_s8(odd), xb),
                                                                    vmull_s8(vget_high_s8(odd), xb)));
#endif
                }
            }
        }
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
            const float32x4_t sw = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(block + 256 + 8 * q)));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const int32x4_t exact = vsubq_s32(dots[r][q], vdupq_n_s32(rows[r].offsets[b]));
                const float32x4_t scale = vmulq_f32(sw, vdupq_n_f32(rows[r].scales[b]));
                sums[r][q] = vaddq_f32(sums[r][q], vmulq_f32(vcvtq_f32_s32(exact), scale));
            }
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) vst1q_f32(acc[r] + 4 * q, sums[r][q]);
#else
    /* GCC vectors (SSE2 on x86-64): a quarter of a pair (4 outputs x 4 inputs, both chunks' nibbles) widened to
     * int16, times the row's activations repeated, summed per lane in int16 over the block (8 products of at most
     * 15 * 127 each), then each output's 4 lanes added in int32; the float steps per output as on the other paths */
    typedef uint8_t v16u8 __attribute__((vector_size(16)));
    typedef int16_t v16i16 __attribute__((vector_size(32)));
    for (int r = 0; r < R; r++)
        for (int lane = 0; lane < GROUP; lane++) acc[r][lane] = 0.0f;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = weights + b * BLOCK_BYTES;
        for (int line = 0; line < BLOCK_BYTES; line += 64) prefetch_ahead(block + line);  /* simd.h */
        for (int r = 0; r < R; r++) {
            const int8_t *x = rows[r].codes + b * BLOCK;
            v16i16 lanes[4] = {{0}};
            for (int p = 0; p < 4; p++) {
                const int8_t *xa = x + 8 * p, *xb = xa + 4;
                const v16i16 even_x = {xa[0], xa[1], xa[2], xa[3], xa[0], xa[1], xa[2], xa[3],
                                       xa[0], xa[1], xa[2], xa[3], xa[0], xa[1], xa[2], xa[3]};
                const v16i16 odd_x = {xb[0], xb[1], xb[2], xb[3], xb[0], xb[1], xb[2], xb[3],
                                      xb[0], xb[1], xb[2], xb[3], xb[0], xb[1], xb[2], xb[3]};
                for (int q = 0; q < 4; q++) {
                    v16u8 nibbles;
                    memcpy(&nibbles, block + 64 * p + 16 * q, sizeof nibbles);
                    lanes[q] += __builtin_convertvector(nibbles & 0x0F, v16i16) * even_x +
                                __builtin_convertvector(nibbles >> 4, v16i16) * odd_x;
                }
            }
            for (int q = 0; q < 4; q++)
                for (int o = 0; o < 4; o++) {
                    const int lane = 4 * q + o;
                    const int32_t dot = (int32_t)lanes[q][4 * o] + lanes[q][4 * o + 1] + lanes[q][4 * o + 2] +
                                        lanes[q][4 * o + 3];
                    const float exact = (float)(dot - rows[r].offsets[b]);
                    acc[r][lane] = acc[r][lane] + exact * (scale_at(block, lane) * rows[r].scales[b]);
                }
        }
    }
#endif
}

#define ROWS_CASE(R)                                                                                             \
    case R:                                                                                                     \
        group_tile(rows, weights, blocks, acc, R);                                                              \
        break;

/* Activations for the int4 kernel: M rows of K' codes, then each row's block scales and offsets. */
int64_t int4_prepared_bytes(int64_t M, int64_t K) {
    const int64_t Kp = round_up(K, BLOCK);
    return M * Kp + 64 + M * (Kp / BLOCK) * (int64_t)(sizeof(float) + sizeof(int32_t));
}

/* This thread's part of preparing M rows x (M, K) (inside the team's parallel region; one thread outside it): the
 * rows' blocks are independent, split evenly between the threads, and taken a few at a time within a row. With
 * `swiglu` the rows are SwiGLU's, silu(gate) * up of x (M, 2K) as (gate | up) per row (matmul.c
 * team_swiglu_matmul): each few blocks' values are computed into a buffer just before they are quantized. */
void int4_prepare_share(const float *x, int64_t M, int64_t K, int swiglu, void *prepared, int part, int parts) {
    enum { AT_ONCE = 8 };  /* blocks at a time: silu's vectors stream through one loop, their floats stay in L1 */
    const int64_t Kp = round_up(K, BLOCK), blocks = Kp / BLOCK, total = M * blocks, last = total * (part + 1) / parts;
    int8_t *codes = prepared;
    float *scales = (float *)(codes + M * Kp + 64);
    int32_t *offsets = (int32_t *)(scales + M * blocks);
    float values[AT_ONCE * BLOCK];
    for (int64_t i = total * part / parts, count; i < last; i += count) {
        const int64_t m = i / blocks, b = i % blocks, k0 = b * BLOCK;
        count = last - i < AT_ONCE ? last - i : AT_ONCE;
        count = blocks - b < count ? blocks - b : count;  /* within row m */
        const int64_t width = K - k0 < count * BLOCK ? K - k0 : count * BLOCK;
        const float *span = x + m * K + k0;
        if (swiglu) {
            silu_span(x + m * 2 * K + k0, x + m * 2 * K + K + k0, values, width);  /* simd.h */
            span = values;
        }
        for (int64_t j = 0; j < count; j++) {
            const int64_t done = j * BLOCK, rest = width - done < BLOCK ? width - done : BLOCK;
            quantize_block(span + done, rest, codes + m * Kp + k0 + done, scales + i + j, offsets + i + j);
        }
    }
#pragma omp barrier
}

/* y[r, n0 + lane] = acc[r][lane] (+ bias) for R rows of one output group: whole vectors where the group lies inside N */
static inline void store_group(float acc[MAX_ROWS][GROUP], const float *bias, float *y, int64_t N, int64_t n0, int R) {
#if !defined(EDGE_PORTABLE)
    if (n0 + GROUP <= N) {
        for (int r = 0; r < R; r++)
            for (int lane = 0; lane < GROUP; lane += VL) {
                const vf sum = vf_load(acc[r] + lane);
                vf_store(y + r * N + n0 + lane, bias ? vf_add(sum, vf_load(bias + n0 + lane)) : sum);
            }
        return;
    }
#endif
    for (int r = 0; r < R; r++)
        for (int lane = 0; lane < GROUP && n0 + lane < N; lane++)
            y[r * N + n0 + lane] = bias ? acc[r][lane] + bias[n0 + lane] : acc[r][lane];
}

/* Groups [begin, end) for rows m .. m + R - 1 (R <= 4) */
static void rows_tile(const int8_t *codes, const float *scales, const int32_t *offsets, const uint8_t *packed,
                      const float *bias, float *y, int64_t m, int R, int64_t begin, int64_t end, int64_t N,
                      int64_t Kp) {
    const int64_t blocks = Kp / BLOCK;
    BlockRow rows[MAX_ROWS];
    for (int r = 0; r < R; r++)
        rows[r] = (BlockRow){codes + (m + r) * Kp, scales + (m + r) * blocks, offsets + (m + r) * blocks};
    float acc[MAX_ROWS][GROUP];
    for (int64_t group = begin; group < end; group++) {
        const uint8_t *weights = packed + group * blocks * BLOCK_BYTES;
        switch (R) {
            ROWS_CASE(1)
            ROWS_CASE(2)
            ROWS_CASE(3)
            ROWS_CASE(4)
            default: break;
        }
        store_group(acc, bias, y + m * N, N, group * GROUP, R);
    }
}

/* One thread's share of the outputs (groups of 16 split evenly between `parts` threads), from prepared rows. Up to
 * 4 rows (a decode step, a verify pass) take every group in one sweep. More rows (a prompt) go 4 at a time over a
 * span of groups whose weights stay in cache meanwhile (SPAN_BYTES of them, or one group where K is long). */
void int4_matmul_share(const void *prepared, const uint8_t *packed, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int part, int parts) {
    const int64_t Kp = round_up(K, BLOCK), blocks = Kp / BLOCK, groups = round_up(N, GROUP) / GROUP;
    const int64_t begin = groups * part / parts, end = groups * (part + 1) / parts;
    const int8_t *codes = prepared;
    const float *scales = (const float *)(codes + M * Kp + 64);
    const int32_t *offsets = (const int32_t *)(scales + M * blocks);
    if (M <= MAX_ROWS) {
        rows_tile(codes, scales, offsets, packed, bias, y, 0, (int)M, begin, end, N, Kp);
        return;
    }
    const int64_t span = SPAN_BYTES / (blocks * BLOCK_BYTES) > 1 ? SPAN_BYTES / (blocks * BLOCK_BYTES) : 1;
    for (int64_t first = begin; first < end; first += span)
        for (int64_t m = 0; m < M; m += MAX_ROWS)
            rows_tile(codes, scales, offsets, packed, bias, y, m, M - m < MAX_ROWS ? (int)(M - m) : MAX_ROWS, first,
                      end - first < span ? end : first + span, N, Kp);
}
