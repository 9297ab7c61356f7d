/* edge's own quantization of float matrices into block formats (--weights int4 for a 16- or 32-bit checkpoint),
 * written in the GGUF file layout (blocks_repack then groups it):
 *
 *   q4_1  4-bit codes with a scale d and a minimum m per 32 weights (w ~ d q + m, llama.cpp's Q4_1 layout). The pair
 *         is searched: 15 candidate steps (15 + 0.15 s) / (max - min), s in [-7, 7], each giving codes from the
 *         block's minimum and then the least-squares d and m for those codes, rounded to float16 and ranked by their
 *         squared error (from the codes' sums); the best pair's codes are taken again for it, and the pair is kept
 *         where its squared error is below that of min / max alone (d = (max - min) / 15, m = min).
 *   q8_0  8-bit codes with one scale per 32 weights, d = max|w| / 127 (llama.cpp's reference quantizer, bit for bit).
 *
 * C in one fixed order (no reassociation: -ffp-contract=off, no fast-math), so every CPU path quantizes a checkpoint
 * into the same bytes.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "blocks.h"
#include "simd.h"

#define CANDIDATES 7  /* candidate steps (15 + STEP * s) / (max - min) for s in [-CANDIDATES, CANDIDATES] */
#define STEP 0.15f

/* q4_1 quantizes BATCH blocks side by side, each step a loop over the batch: every operation is element-wise (IEEE
 * arithmetic, nearbyintf, comparisons, integer bit steps), so the compiler may vectorize it across blocks and the
 * bytes stay those of the scalar loop; each block's sums run over its weights in order. */
#define BATCH 16
#define EACH(b) for (int b = 0; b < BATCH; b++)

static inline uint32_t float_bits(float v) { union { float f; uint32_t u; } c = {.f = v}; return c.u; }
static inline float bits_float(uint32_t u) { union { uint32_t u; float f; } c = {.u = u}; return c.f; }
/* all ones where `condition`, else zero: selects written as masks, so the compiler computes both sides (no branch) */
static inline uint32_t mask_of(int condition) { return 0u - (uint32_t)(condition != 0); }

/* simd.h's half_bits without branches: the same bits for every non-NaN float (checked over all 2^32) */
static inline uint32_t half_bits_select(float value) {
    const uint32_t bits = float_bits(value), magnitude = bits & 0x7FFFFFFFu, sign = (bits >> 16) & 0x8000u;
    const uint32_t beyond = magnitude > 0x7F800000u ? 0x7E00u : 0x7C00u;
    const float small = bits_float(magnitude < 0x38800000u ? magnitude : 0x38800000u);
    const uint32_t subnormal = (uint32_t)(int32_t)nearbyintf(small * 0x1p24f);  /* units of 2^-24 */
    const uint32_t rebased = magnitude - 0x38000000u;  /* exponent 127 -> 15; rounded to nearest, ties to even */
    const uint32_t normal = (rebased + 0x0FFFu + ((rebased >> 13) & 1)) >> 13;
    const uint32_t is_big = mask_of(magnitude >= 0x47800000u), is_small = mask_of(magnitude < 0x38800000u);
    return sign | (beyond & is_big) | (subnormal & is_small) | (normal & ~(is_big | is_small));
}

/* float16 bits -> float32, exact, without branches */
static inline float half_float(uint32_t half) {
    const uint32_t sign = (half & 0x8000u) << 16, exponent = (half >> 10) & 0x1F, mantissa = half & 0x3FFu;
    const uint32_t wide = exponent == 0x1F ? 0x7F800000u | mantissa << 13 : (exponent + 112) << 23 | mantissa << 13;
    const float subnormal = (float)(int32_t)mantissa * 0x1p-24f;
    const uint32_t is_subnormal = mask_of(exponent == 0);
    return bits_float(sign | (float_bits(subnormal) & is_subnormal) | (wide & ~is_subnormal));
}

/* 1 / v for v > 0, else 0: the division on a safe value, then a mask */
static inline float positive_reciprocal(float v) {
    const float reciprocal = 1.0f / (v > 0.0f ? v : 1.0f);
    return bits_float(float_bits(reciprocal) & mask_of(v > 0.0f));
}

/* codes[i][b] = round((x[i][b] - m[b]) * inverse[b]) clamped to [0, 15] */
static void q4_1_codes(const float x[32][BATCH], const float *m, const float *inverse, float codes[32][BATCH]) {
    for (int i = 0; i < 32; i++)
        EACH(b) {
            const float c = nearbyintf((x[i][b] - m[b]) * inverse[b]);
            codes[i][b] = c < 0.0f ? 0.0f : c > 15.0f ? 15.0f : c;
        }
}

/* error[b] = sum_i (d q + m - x)^2 */
static void q4_1_error(const float x[32][BATCH], const float *d, const float *m, const float codes[32][BATCH],
                       float *error) {
    EACH(b) error[b] = 0.0f;
    for (int i = 0; i < 32; i++)
        EACH(b) {
            const float diff = d[b] * codes[i][b] + m[b] - x[i][b];
            error[b] += diff * diff;
        }
}

/* BATCH blocks of 32 weights (x[i][b]: weight i of block b) -> BATCH file blocks, each: d, m (float16), 16 bytes of
 * nibbles (element j low, j + 16 high) */
static void quantize_q4_1(const float x[32][BATCH], block_q4_1 *out) {
    float lo[BATCH], hi[BATCH], sx[BATCH], sxx[BATCH], range[BATCH], reciprocal_range[BATCH];
    EACH(b) lo[b] = hi[b] = x[0][b], sx[b] = sxx[b] = 0.0f;
    for (int i = 0; i < 32; i++)
        EACH(b) {
            lo[b] = x[i][b] < lo[b] ? x[i][b] : lo[b];
            hi[b] = x[i][b] > hi[b] ? x[i][b] : hi[b];
            sx[b] += x[i][b];
            sxx[b] += x[i][b] * x[i][b];
        }
    EACH(b) range[b] = hi[b] - lo[b], reciprocal_range[b] = positive_reciprocal(range[b]);

    float codes[32][BATCH] __attribute__((aligned(64)));
    float pick[BATCH], inverse[BATCH], sqx[BATCH];
    uint32_t pick_d[BATCH], pick_m[BATCH];
    int32_t sq[BATCH], sqq[BATCH];
    EACH(b) pick[b] = INFINITY, pick_d[b] = pick_m[b] = 0;
    for (int step = -CANDIDATES; step <= CANDIDATES; step++) {
        EACH(b) inverse[b] = (15.0f + STEP * (float)step) * reciprocal_range[b];
        q4_1_codes(x, lo, inverse, codes);
        EACH(b) sq[b] = sqq[b] = 0, sqx[b] = 0.0f;
        for (int i = 0; i < 32; i++)
            EACH(b) {
                const int32_t c = (int32_t)codes[i][b];  /* sums at most 32 * 15 and 32 * 225: det is exact */
                sq[b] += c, sqq[b] += c * c;
                sqx[b] += codes[i][b] * x[i][b];
            }
        EACH(b) {
            /* least squares over (d, m) for these codes (det > 0 unless all codes are equal), rounded to float16,
             * ranked by sum (d q + m - x)^2 from the sums */
            const int32_t det = 32 * sqq[b] - sq[b] * sq[b];
            const float share = 1.0f / (float)(det > 1 ? det : 1);  /* a max: the division runs unconditionally */
            const float d = (32.0f * sqx[b] - (float)sq[b] * sx[b]) * share;
            const float m = ((float)sqq[b] * sx[b] - (float)sq[b] * sqx[b]) * share;
            const uint32_t d16 = half_bits_select(d), m16 = half_bits_select(m);
            const float dr = half_float(d16), mr = half_float(m16);
            const float error = dr * (dr * (float)sqq[b] + 2.0f * mr * (float)sq[b] - 2.0f * sqx[b])
                                + mr * (32.0f * mr - 2.0f * sx[b]) + sxx[b];
            const int better = (det > 0) & (dr > 0.0f) & (error < pick[b]);
            pick[b] = better ? error : pick[b];
            pick_d[b] = better ? d16 : pick_d[b];
            pick_m[b] = better ? m16 : pick_m[b];
        }
    }

    /* the pick's codes taken again for its rounded pair, kept where no worse than the range's own pair */
    float picked[32][BATCH] __attribute__((aligned(64)));
    float d0[BATCH], m0[BATCH], d1[BATCH], m1[BATCH], error0[BATCH], error1[BATCH];
    uint32_t d0_bits[BATCH], m0_bits[BATCH];
    EACH(b) {
        d0_bits[b] = half_bits_select(range[b] / 15.0f), m0_bits[b] = half_bits_select(lo[b]);
        d0[b] = half_float(d0_bits[b]), m0[b] = half_float(m0_bits[b]);
        inverse[b] = positive_reciprocal(d0[b]);
    }
    q4_1_codes(x, m0, inverse, codes);
    q4_1_error(x, d0, m0, codes, error0);
    EACH(b) {
        d1[b] = half_float(pick_d[b]), m1[b] = half_float(pick_m[b]);
        inverse[b] = positive_reciprocal(d1[b]);
    }
    q4_1_codes(x, m1, inverse, picked);
    q4_1_error(x, d1, m1, picked, error1);
    for (int b = 0; b < BATCH; b++) {
        const int take = pick[b] < INFINITY && error1[b] < error0[b];
        const float (*chosen)[BATCH] = take ? picked : codes;
        block_q4_1 *block = out + b;
        block->d = (uint16_t)(take ? pick_d[b] : d0_bits[b]);
        block->m = (uint16_t)(take ? pick_m[b] : m0_bits[b]);
        for (int j = 0; j < 16; j++) block->qs[j] = (uint8_t)((uint8_t)chosen[j][b] | (uint8_t)chosen[j + 16][b] << 4);
    }
}

/* one block of 32 weights -> its file block: d (float16), 32 int8 codes round(w / d), ties away from zero */
static void quantize_q8_0(const float *x, block_q8_0 *out) {
    float top = 0.0f;
    for (int i = 0; i < 32; i++) top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
    const float d = top / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
    out->d = half_bits(d);
    for (int i = 0; i < 32; i++) out->qs[i] = (int8_t)roundf(x[i] * inverse);
}

/* block `index` of x (N, K), the rows' blocks one after another; a last partial block padded with zero weights */
static void load_block(const float *x, int64_t K, int64_t blocks, int64_t index, float *block) {
    const int64_t n = index / blocks, b = index % blocks, width = K - 32 * b < 32 ? K - 32 * b : 32;
    memset(block, 0, 32 * sizeof(float));
    memcpy(block, x + n * K + 32 * b, (size_t)width * sizeof(float));
}

/* x (N, K) float32 -> the file layout of `format` (BLOCKS_Q4_1 or BLOCKS_Q8_0): N rows of K / 32 blocks, rounded
 * up (a last partial block padded with zero weights) */
void blocks_quantize(int format, const float *x, int64_t N, int64_t K, uint8_t *file, int threads) {
    const int64_t blocks = (K + 31) / 32, total = N * blocks, bytes = block_file_bytes(format);
    if (format == BLOCKS_Q8_0) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t index = 0; index < total; index++) {
            float block[32];
            load_block(x, K, blocks, index, block);
            quantize_q8_0(block, (block_q8_0 *)file + index);
        }
        return;
    }
    const int64_t batches = (total + BATCH - 1) / BATCH;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t batch = 0; batch < batches; batch++) {
        float block[32], side_by_side[32][BATCH] __attribute__((aligned(64)));
        block_q4_1 out[BATCH];
        const int64_t first = batch * BATCH, count = total - first < BATCH ? total - first : BATCH;
        for (int b = 0; b < BATCH; b++) {  /* a last short batch filled with zero blocks, written nowhere */
            if (b < count) load_block(x, K, blocks, first + b, block);
            else memset(block, 0, sizeof block);
            for (int i = 0; i < 32; i++) side_by_side[i][b] = block[i];
        }
        quantize_q4_1(side_by_side, out);
        memcpy(file + first * bytes, out, (size_t)(count * bytes));
    }
}
