/* edge's own quantization of float matrices into block formats (--weights int4 for a 16- or 32-bit checkpoint),
 * written in the GGUF file layout (blocks_repack then groups it):
 *
 *   q4_1  4-bit codes with a scale d and a minimum m per 32 weights (w ~ d q + m, llama.cpp's Q4_1 layout). The pair
 *         is searched: from the block's range, 21 candidate steps around 15 / (max - min), each giving codes and then
 *         the least-squares d and m for them; d and m rounded to float16, the codes taken again for the rounded
 *         pair, and the pair with the smallest squared error kept (never worse than min / max alone).
 *   q8_0  8-bit codes with one scale per 32 weights, d = max|w| / 127 (llama.cpp's reference quantizer, bit for bit).
 *
 * Plain scalar C in one fixed order (no reassociation: -ffp-contract=off, no fast-math), so every CPU path quantizes a
 * checkpoint into the same bytes.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "blocks.h"
#include "simd.h"

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* codes for (d, m) and their squared error */
static float q4_1_codes(const float *x, float d, float m, uint8_t *q) {
    float error = 0.0f;
    for (int i = 0; i < 32; i++) {
        float code = d > 0.0f ? nearbyintf((x[i] - m) / d) : 0.0f;
        code = code < 0.0f ? 0.0f : code > 15.0f ? 15.0f : code;
        q[i] = (uint8_t)code;
        const float diff = d * code + m - x[i];
        error += diff * diff;
    }
    return error;
}

/* one block of 32 weights -> 20 bytes: d, m (float16), 16 bytes of nibbles (element j low, j + 16 high) */
static void quantize_q4_1(const float *x, uint8_t *out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    uint8_t q[32], trial[32];
    uint16_t best_d = half_bits((hi - lo) / 15.0f), best_m = half_bits(lo);
    float best = q4_1_codes(x, f16_to_f32(best_d), f16_to_f32(best_m), q);
    for (int step = -10; step <= 10 && hi > lo; step++) {
        const float inverse = (15.0f + 0.1f * (float)step) / (hi - lo);
        double n = 32.0, sq = 0.0, sqq = 0.0, sx = 0.0, sqx = 0.0;
        for (int i = 0; i < 32; i++) {
            float code = nearbyintf((x[i] - lo) * inverse);
            code = code < 0.0f ? 0.0f : code > 15.0f ? 15.0f : code;
            sq += code, sqq += (double)code * code, sx += x[i], sqx += (double)code * x[i];
        }
        const double det = n * sqq - sq * sq;
        if (det <= 0.0) continue;
        const double d = (n * sqx - sq * sx) / det, m = (sqq * sx - sq * sqx) / det;
        if (!(d > 0.0)) continue;
        const uint16_t d16 = half_bits((float)d), m16 = half_bits((float)m);
        const float error = q4_1_codes(x, f16_to_f32(d16), f16_to_f32(m16), trial);
        if (error < best) {
            best = error, best_d = d16, best_m = m16;
            memcpy(q, trial, sizeof q);
        }
    }
    put16(out, best_d);
    put16(out + 2, best_m);
    for (int j = 0; j < 16; j++) out[4 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

/* one block of 32 weights -> 34 bytes: d (float16), 32 int8 codes round(w / d), ties away from zero */
static void quantize_q8_0(const float *x, uint8_t *out) {
    float top = 0.0f;
    for (int i = 0; i < 32; i++) top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
    const float d = top / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
    put16(out, half_bits(d));
    for (int i = 0; i < 32; i++) out[2 + i] = (uint8_t)(int8_t)roundf(x[i] * inverse);
}

/* x (N, K) float32 -> the file layout of `format` (BLOCKS_Q4_1 or BLOCKS_Q8_0): N rows of K / 32 blocks, rounded
 * up (a last partial block padded with zero weights) */
void blocks_quantize(int format, const float *x, int64_t N, int64_t K, uint8_t *file, int threads) {
    const int64_t blocks = (K + 31) / 32, bytes = block_file_bytes(format);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *out = file + (n * blocks + b) * bytes;
            float block[32] = {0};
            memcpy(block, x + n * K + 32 * b, (size_t)(K - 32 * b < 32 ? K - 32 * b : 32) * sizeof(float));
            if (format == BLOCKS_Q4_1) quantize_q4_1(block, out);
            else quantize_q8_0(block, out);
        }
}
