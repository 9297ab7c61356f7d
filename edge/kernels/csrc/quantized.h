/* What the int8 and block kernels share: activation rows quantized to signed bytes, exactly.
 *
 * A row (or a block of one) is scaled by 127 / max|x|, rounded half to even and clamped to [-127, 127]; the scale
 * returned is max|x| / 127 (0 for an all-zero row, whose codes are all 0). Vector and scalar rounding agree (both
 * round half to even in the default mode), so every path produces the same codes.
 */
#ifndef EDGE_QUANTIZED_H
#define EDGE_QUANTIZED_H

#include "simd.h"

/* max|x[k]| over [0, K): exact in any order, so the vector lanes may take the elements in any grouping */
static inline float absolute_max(const float *x, int64_t K) {
    float top = 0.0f;
    int64_t k = 0;
#if !defined(EDGE_PORTABLE)
    vf tops = vf_zero();
    for (; k + VL <= K; k += VL) {
        const vf v = vf_load(x + k);
        tops = vf_max(tops, vf_max(v, vf_sub(vf_zero(), v)));
    }
    float lanes[VL];
    vf_store(lanes, tops);
    for (int lane = 0; lane < VL; lane++) top = lanes[lane] > top ? lanes[lane] : top;
#endif
    for (; k < K; k++) top = fabsf(x[k]) > top ? fabsf(x[k]) : top;
    return top;
}

/* x[0, K) -> out[0, K) signed codes at the scale of `top` (max|x| of the whole row or block x belongs to); returns the
 * codes' sum, taken from the registers as they are written (the block formats' offsets need it; reading the bytes back
 * just after their 8-byte stores stalled on store forwarding) */
static inline int32_t quantize_with(const float *x, int8_t *out, int64_t K, float top) {
    if (top == 0.0f) {
        memset(out, 0, K);
        return 0;
    }
    const float inverse = 127.0f / top;
    int32_t sum = 0;
    int64_t k = 0;
#if defined(EDGE_X86)
    __m256i sums = _mm256_setzero_si256();
    for (; k + 8 <= K; k += 8) {
        const __m256i clamped = codes_of8(_mm256_loadu_ps(x + k), _mm256_set1_ps(inverse));
        sums = _mm256_add_epi32(sums, clamped);
        const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(clamped), _mm256_extracti128_si256(clamped, 1));
        const __m128i bytes = _mm_packs_epi16(words, words);
        memcpy(out + k, &bytes, 8);
    }
    sum = sum_of8(sums);
#elif defined(EDGE_NEON)
    int32x4_t sums = vdupq_n_s32(0);
    for (; k + 4 <= K; k += 4) {  /* vcvtnq rounds half to even */
        const int32x4_t q = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + k), vdupq_n_f32(inverse)));
        const int32x4_t clamped = vmaxq_s32(vminq_s32(q, vdupq_n_s32(127)), vdupq_n_s32(-127));
        sums = vaddq_s32(sums, clamped);
        const int16x4_t words = vmovn_s32(clamped);
        const int8x8_t bytes = vmovn_s16(vcombine_s16(words, words));
        const int32_t word = vget_lane_s32(vreinterpret_s32_s8(bytes), 0);
        memcpy(out + k, &word, 4);
    }
    sum = vaddvq_s32(sums);
#endif
    for (; k < K; k++) {
        float q = nearbyintf(x[k] * inverse);
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        out[k] = (int8_t)q;
        sum += out[k];
    }
    return sum;
}

/* x[0, K) -> out[0, K) signed codes and *sum their sum; returns max|x| (the caller divides) */
static inline float quantize_codes(const float *x, int8_t *out, int64_t K, int32_t *sum) {
    const float top = absolute_max(x, K);
    *sum = quantize_with(x, out, K, top);
    return top;
}

static inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

#endif
