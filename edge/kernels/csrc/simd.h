/* The vector primitives of each CPU path, so the kernels are written once.
 *
 * edge/kernels/cpu_paths.py builds one library per path from the same sources, with that path's compiler flags; the
 * flags alone pick the branch below:
 *
 *   path       flags                              float vectors        int8 / block dot products
 *   avx512     -march=x86-64-v4 [-mavx512vnni]    16 lanes (zmm)       vpdpbusd (VNNI), else the avx2 code
 *   avx2       -march=haswell (AVX2, FMA, F16C)    8 lanes (ymm)        vpmaddubsw + vpmaddwd
 *   neon       -march=armv8.2-a+dotprod / armv8-a  4 lanes (q regs)     sdot, else smull + pairwise adds
 *   portable   the compiler's baseline             4 lanes (GCC vectors, SSE2 on x86-64), multiply then add
 *
 * One helper set per path, here and nowhere else: scalar conversions, float vectors (vf), activation codes and integer
 * dots (codes_of8, sum_of8, dot4_s8) and the block formats' integer lanes (lb, lw, li, lf); the kernel files only
 * combine them.
 *
 * EDGE_EMULATE_AVX512 (tests only) compiles the avx512 branch on any x86-64 CPU with SIMDe's portable AVX-512:
 * the same code, checked for what it computes, not for speed.
 *
 * Every reduction below has one fixed order per path, and the kernels never let the number of rows in a call
 * change any row's operations: that is what keeps a verify pass equal to decode steps, bit for bit. Paths differ
 * from each other in float rounding (lane counts differ); the integer kernels give the same bits on every path.
 */
#ifndef EDGE_SIMD_H
#define EDGE_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "interface.h"

#if defined(EDGE_EMULATE_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define EDGE_AVX512 1
#define EDGE_VNNI 1
#define EDGE_PATH "avx512-emulated"
static inline float f16_to_f32(uint16_t bits);
/* the intrinsics the kernels use that SIMDe 0.7 lacks, lane by lane (or its own, where it has no native alias) */
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4(a, b, imm8)
static inline simde__m512 emulated_cvtph_ps(simde__m256i halves) {
    uint16_t bits[16];
    float out[16];
    simde_mm256_storeu_si256((simde__m256i *)bits, halves);
    for (int i = 0; i < 16; i++) out[i] = f16_to_f32(bits[i]);
    return simde_mm512_loadu_ps(out);
}
static inline simde__m512 emulated_cvtepi32_ps(simde__m512i v) {
    int32_t values[16];
    float out[16];
    simde_mm512_storeu_si512(values, v);
    for (int i = 0; i < 16; i++) out[i] = (float)values[i];
    return simde_mm512_loadu_ps(out);
}
static inline simde__m256 emulated_extractf32x8_ps(simde__m512 v, int upper) {
    float lanes[16];
    simde_mm512_storeu_ps(lanes, v);
    return simde_mm256_loadu_ps(lanes + 8 * upper);
}
static inline simde__m512i emulated_cvtepu16_epi32(simde__m256i halves) {
    uint16_t bits[16];
    int32_t out[16];
    simde_mm256_storeu_si256((simde__m256i *)bits, halves);
    for (int i = 0; i < 16; i++) out[i] = bits[i];
    return simde_mm512_loadu_si512(out);
}
static inline simde__m512i emulated_cvtepi8_epi32(simde__m128i bytes) {
    int8_t in[16];
    int32_t out[16];
    simde_mm_storeu_si128((simde__m128i *)in, bytes);
    for (int i = 0; i < 16; i++) out[i] = in[i];
    return simde_mm512_loadu_si512(out);
}
static inline simde__m512i emulated_cvtepu8_epi32(simde__m128i bytes) {
    uint8_t in[16];
    int32_t out[16];
    simde_mm_storeu_si128((simde__m128i *)in, bytes);
    for (int i = 0; i < 16; i++) out[i] = in[i];
    return simde_mm512_loadu_si512(out);
}
static inline simde__m512i emulated_cvtepu8_epi16(simde__m256i bytes) {
    uint8_t in[32];
    int16_t out[32];
    simde_mm256_storeu_si256((simde__m256i *)in, bytes);
    for (int i = 0; i < 32; i++) out[i] = in[i];
    return simde_mm512_loadu_si512(out);
}
#define _mm512_cvtph_ps emulated_cvtph_ps
#define _mm512_cvtepu8_epi16 emulated_cvtepu8_epi16
#define _mm512_cvtepi8_epi32 emulated_cvtepi8_epi32
#define _mm512_cvtepu8_epi32 emulated_cvtepu8_epi32
#define _mm512_cvtepu16_epi32 emulated_cvtepu16_epi32
#define _mm512_cvtepi32_ps emulated_cvtepi32_ps
#define _mm512_extractf32x8_ps emulated_extractf32x8_ps
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define EDGE_AVX512 1
#if defined(__AVX512VNNI__)
#define EDGE_VNNI 1
#define EDGE_PATH "avx512-vnni"
#else
#define EDGE_PATH "avx512"
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define EDGE_AVX2 1
#define EDGE_PATH "avx2"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define EDGE_NEON 1
#if defined(__ARM_FEATURE_DOTPROD)
#define EDGE_DOTPROD 1
#define EDGE_PATH "neon-dotprod"
#else
#define EDGE_PATH "neon"
#endif
#else
#define EDGE_PORTABLE 1
#define EDGE_PATH "portable"
#endif

/* the 256-bit integer code serves both x86 paths (every AVX-512 CPU has AVX2) */
#if defined(EDGE_AVX512) || defined(EDGE_AVX2)
#define EDGE_X86 1
#endif

/* ---- scalar conversions (tails, embeddings, norms) ---- */

static inline float bf16_to_f32(uint16_t bits) {
    const uint32_t wide = (uint32_t)bits << 16;  /* bfloat16 bits are the top of a float32 */
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

/* float16 -> float32 is exact: the hardware conversion where the path has one, else bit arithmetic */
static inline float f16_to_f32(uint16_t bits) {
#if defined(EDGE_X86) && !defined(EDGE_EMULATE_AVX512)
    return _cvtsh_ss(bits);
#elif defined(EDGE_NEON)
    __fp16 half;
    memcpy(&half, &bits, sizeof half);
    return (float)half;
#else
    const uint32_t sign = (uint32_t)(bits & 0x8000) << 16, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
    uint32_t wide;
    if (exponent == 0x1f) {
        wide = sign | 0x7f800000u | (mantissa << 13);  /* inf, nan */
    } else if (exponent != 0) {
        wide = sign | ((exponent + 112) << 23) | (mantissa << 13);  /* normal: rebias 15 -> 127 */
    } else if (mantissa == 0) {
        wide = sign;  /* zero */
    } else {  /* subnormal: mantissa * 2^-24, exact in float32 */
        float value = (float)mantissa * 0x1p-24f;
        memcpy(&wide, &value, sizeof wide);
        wide |= sign;
    }
    float out;
    memcpy(&out, &wide, sizeof out);
    return out;
#endif
}

/* float32 -> the bits of the nearest float16 (ties to even), in integer arithmetic: the same on every path */
static inline uint16_t half_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    const uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7FFFFFFFu;
    uint32_t half;
    if (magnitude >= 0x47800000u) {  /* beyond float16's range (or inf / nan): inf, nan kept */
        half = magnitude > 0x7F800000u ? 0x7E00u : 0x7C00u;
    } else if (magnitude < 0x38800000u) {  /* a float16 subnormal (or zero): units of 2^-24, exact to scale */
        half = (uint32_t)nearbyintf(fabsf(value) * 0x1p24f);
    } else {  /* round the 13 dropped mantissa bits to nearest, ties to even (a carry may raise the exponent) */
        const uint32_t rebased = magnitude - 0x38000000u;  /* exponent 127 -> 15 */
        half = (rebased >> 13) + (((rebased >> 12) & 1) & (((rebased & 0x0FFFu) != 0) | ((rebased >> 13) & 1)));
    }
    return (uint16_t)(half | sign >> 16);
}

/* float32 -> float16 bits, rounded to nearest even (as torch's .half()): the hardware conversion where the path has
 * one (kv_hierarchical.c) */
static inline uint16_t f32_to_f16(float value) {
#if defined(EDGE_X86) && !defined(EDGE_EMULATE_AVX512)
    return _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT);
#elif defined(EDGE_NEON)
    const __fp16 half = (__fp16)value;
    uint16_t bits;
    memcpy(&bits, &half, sizeof bits);
    return bits;
#else
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return sign | 0x7e00;        /* nan */
    if (magnitude >= 0x477ff000u) return sign | 0x7c00;       /* 65520 and above round to inf */
    if (magnitude < 0x38800000u)                              /* below 2^-14: a subnormal, in units of 2^-24 */
        return sign | (uint16_t)nearbyintf(fabsf(value) * 0x1p24f);
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);  /* half to even on the 13 dropped bits */
    return sign | (uint16_t)((rounded - 0x38000000u) >> 13);  /* rebias the exponent 127 -> 15 */
#endif
}

/* ---- float vectors: vf holds VL floats ---- */

#if defined(EDGE_AVX512)
typedef __m512 vf;
#define VL 16
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set(float a) { return _mm512_set1_ps(a); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vf_load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_fma(vf acc, vf a, vf b) { return _mm512_fmadd_ps(a, b, acc); } /* acc + a * b, one rounding */
/* 2^n from the bits of n + 1.5 * 2^23 (see vf_exp) */
static inline vf vf_pow2_bits(vf shifted) {
    const __m512i bits = _mm512_castps_si512(shifted);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(127 - 0x4B400000)), 23));
}
static inline float vf_reduce(vf v) { /* upper half onto lower half: 8, 4, 2, 1 lanes */
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
/* out[i] = vf_reduce(acc[i]) for VL vectors, bit for bit (each sum the same tree of additions: lane l + lane l + 8,
 * then + 4, + 2, + 1), in four transposing steps instead of VL reductions */
static inline void vf_reduce_many(const vf *acc, float *out) {
    vf halves[8], quarters[4], pairs[2];
    for (int i = 0; i < 8; i++)  /* keys 2i, 2i + 1: lanes l + l + 8 in halves */
        halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++)  /* keys 4i .. 4i + 3: + 4, one 128-bit chunk each */
        quarters[i] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++)  /* chunk c: keys 8i + c, 8i + 4 + c: + 2 */
        pairs[i] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const vf sums = _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));  /* + 1 */
    /* lane 4c + i holds key c + 4i */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, sums));
}
#elif defined(EDGE_AVX2)
typedef __m256 vf;
#define VL 8
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_set(float a) { return _mm256_set1_ps(a); }
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vf_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vf_load_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_fma(vf acc, vf a, vf b) { return _mm256_fmadd_ps(a, b, acc); }
static inline vf vf_pow2_bits(vf shifted) {
    const __m256i bits = _mm256_castps_si256(shifted);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(127 - 0x4B400000)), 23));
}
static inline float vf_reduce(vf v) { /* 4, 2, 1 lanes */
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
/* out[i] = vf_reduce(acc[i]) for VL vectors, bit for bit (lane l + lane l + 4, then + 2, + 1), transposing */
static inline void vf_reduce_many(const vf *acc, float *out) {
    vf halves[4], pairs[2];
    for (int i = 0; i < 4; i++)  /* keys 2i, 2i + 1: + 4, one 128-bit half each */
        halves[i] = _mm256_add_ps(_mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x20),
                                  _mm256_permute2f128_ps(acc[2 * i], acc[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++)  /* half c: keys 4i + c, 4i + 2 + c: + 2 */
        pairs[i] = _mm256_add_ps(_mm256_shuffle_ps(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const vf sums = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));  /* + 1 */
    /* lane 4c + i holds key c + 2i */
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#elif defined(EDGE_NEON)
typedef float32x4_t vf;
#define VL 4
static inline vf vf_zero(void) { return vdupq_n_f32(0.0f); }
static inline vf vf_set(float a) { return vdupq_n_f32(a); }
static inline vf vf_load(const float *p) { return vld1q_f32(p); }
static inline void vf_store(float *p, vf v) { vst1q_f32(p, v); }
static inline vf vf_load_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline vf vf_load_bf16(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
static inline vf vf_add(vf a, vf b) { return vaddq_f32(a, b); }
static inline vf vf_sub(vf a, vf b) { return vsubq_f32(a, b); }
static inline vf vf_mul(vf a, vf b) { return vmulq_f32(a, b); }
static inline vf vf_max(vf a, vf b) { return vmaxq_f32(a, b); }
static inline vf vf_min(vf a, vf b) { return vminq_f32(a, b); }
static inline vf vf_div(vf a, vf b) { return vdivq_f32(a, b); }
static inline vf vf_fma(vf acc, vf a, vf b) { return vfmaq_f32(acc, a, b); }
static inline vf vf_pow2_bits(vf shifted) {
    const int32x4_t bits = vreinterpretq_s32_f32(shifted);
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(bits, vdupq_n_s32(127 - 0x4B400000)), 23));
}
static inline float vf_reduce(vf v) { /* 2, 1 lanes */
    const float32x2_t s2 = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}
/* out[i] = vf_reduce(acc[i]) for VL vectors, bit for bit (lane l + lane l + 2, then + 1) */
static inline void vf_reduce_many(const vf *acc, float *out) {
    const vf first = vaddq_f32(vcombine_f32(vget_low_f32(acc[0]), vget_low_f32(acc[1])),
                               vcombine_f32(vget_high_f32(acc[0]), vget_high_f32(acc[1])));  /* keys 0, 1: + 2 */
    const vf second = vaddq_f32(vcombine_f32(vget_low_f32(acc[2]), vget_low_f32(acc[3])),
                                vcombine_f32(vget_high_f32(acc[2]), vget_high_f32(acc[3])));  /* keys 2, 3 */
    vst1q_f32(out, vpaddq_f32(first, second));  /* + 1, keys in order */
}
#else
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi_portable __attribute__((vector_size(16)));
typedef uint32_t vu_portable __attribute__((vector_size(16)));
#define VL 4
static inline vf vf_zero(void) { return (vf){0}; }
static inline vf vf_set(float a) { return (vf){0} + a; }
static inline vf vf_load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vf_store(float *p, vf v) { memcpy(p, &v, sizeof v); }
/* float16 -> float32 on 4 lanes, exactly, in integer vector arithmetic: the magnitude bits moved to float32's places
 * and scaled by 2^112 (exact for normal and subnormal halves alike), infinities and NaNs given float32's top
 * exponent, the sign put back */
static inline vf vf_load_f16(const uint16_t *p) {
    const vu_portable half = {p[0], p[1], p[2], p[3]};
    const vu_portable magnitude = (half & 0x7fff) << 13, sign = (half & 0x8000) << 16;
    vf scaled;
    memcpy(&scaled, &magnitude, sizeof scaled);
    scaled = scaled * 0x1p112f;
    vu_portable bits;
    memcpy(&bits, &scaled, sizeof bits);
    const vu_portable special = (vu_portable)((half & 0x7c00) == 0x7c00);  /* all ones where inf or NaN */
    bits = (bits & ~special) | ((magnitude | 0x7f800000u) & special);
    bits |= sign;
    vf out;
    memcpy(&out, &bits, sizeof out);
    return out;
}
static inline vf vf_load_bf16(const uint16_t *p) {
    const vu_portable bits = (vu_portable){p[0], p[1], p[2], p[3]} << 16;
    vf out;
    memcpy(&out, &bits, sizeof out);
    return out;
}
static inline vf vf_add(vf a, vf b) { return a + b; }
static inline vf vf_sub(vf a, vf b) { return a - b; }
static inline vf vf_mul(vf a, vf b) { return a * b; }
static inline vf vf_max(vf a, vf b) {
    const vi_portable larger = a > b;  /* lane-wise: -1 where a is the larger */
    vi_portable bits_a, bits_b;
    memcpy(&bits_a, &a, sizeof a);
    memcpy(&bits_b, &b, sizeof b);
    bits_a = (bits_a & larger) | (bits_b & ~larger);
    vf out;
    memcpy(&out, &bits_a, sizeof out);
    return out;
}
static inline vf vf_min(vf a, vf b) { /* -max(-a, -b) */
    return vf_sub(vf_set(0.0f), vf_max(vf_sub(vf_set(0.0f), a), vf_sub(vf_set(0.0f), b)));
}
static inline vf vf_div(vf a, vf b) { return a / b; }
static inline vf vf_fma(vf acc, vf a, vf b) { return acc + a * b; } /* two roundings: the build never contracts */
static inline vf vf_pow2_bits(vf shifted) {
    vi_portable bits;
    memcpy(&bits, &shifted, sizeof bits);
    bits = (bits + (127 - 0x4B400000)) << 23;
    vf out;
    memcpy(&out, &bits, sizeof out);
    return out;
}
static inline float vf_reduce(vf v) { return (v[0] + v[2]) + (v[1] + v[3]); } /* 2, 1 lanes, as the others */
static inline void vf_reduce_many(const vf *acc, float *out) {
    for (int i = 0; i < VL; i++) out[i] = vf_reduce(acc[i]);
}
#endif

/* ---- integer dot products: each path's own (matmul_int8.c, and the block lanes below) ---- */

#if defined(EDGE_X86)
/* 8 lanes of x * inverse as codes: rounded half to even (cvtps, as nearbyintf) and clamped to [-127, 127] */
static inline __m256i codes_of8(__m256 x, __m256 inverse) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, inverse));
    return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

/* the sum of 8 int32 lanes */
static inline int32_t sum_of8(__m256i lanes) {
    __m128i sum4 = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
    sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, 0xB1)));
}
#elif defined(EDGE_NEON)
/* acc + per int32 lane the dot of w's 4 signed bytes with x's 4 in that lane: sdot, else int16 products with pairs
 * added (|sum| <= 2 * 128 * 127) and pairs added into int32 */
static inline __attribute__((always_inline)) int32x4_t dot4_s8(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if defined(EDGE_DOTPROD)
    return vdotq_s32(acc, w, x);
#else
    const int16x8_t pairs = vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)),
                                       vmull_s8(vget_high_s8(w), vget_high_s8(x)));
    return vpadalq_s16(acc, pairs);
#endif
}
#endif

/* Keeps an accumulator in a register at this point of a loop: without it GCC re-associates a chain of integer adds
 * across unrolled iterations into a tree of partial sums (to shorten the dependency chain) and spills most of them to
 * the stack; measured twice as slow for 4-bit multi-row tiles. Values are unchanged (integer sums are exact). */
#if defined(EDGE_X86) && !defined(EDGE_EMULATE_AVX512)
#define pin_register(v) __asm__("" : "+x"(v))
#elif defined(EDGE_NEON)
#define pin_register(v) __asm__("" : "+w"(v))
#else
#define pin_register(v) ((void)0)
#endif

/* Where the hardware prefetcher runs too little ahead of a weight stream, the kernel prefetches it 4 KiB ahead
 * itself, one line per 64 bytes consumed: calls with several rows (more compute per byte; a 4-row int8 call over
 * TinyLlama's matrices measured 58 -> 47 ms on an AVX2 server) and the block formats, which read one stream per
 * thread. One-row int8 and float calls read several streams per thread and are faster without. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 4096
#endif
static inline void prefetch_ahead(const void *p) { __builtin_prefetch((const char *)p + PREFETCH_AHEAD); }

/* exp(x) on VL lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by the Cephes single-precision polynomial (about
 * 1 ulp), times 2^n through the exponent bits. x is clamped to [-87, 88] (e^-87 is about 1.6e-38: no weight that
 * small changes a float32 sum; e^88 is near float32's largest). The same operations on every lane and every call. */
static inline vf vf_exp(vf x) {
    x = vf_min(vf_max(x, vf_set(-87.0f)), vf_set(88.0f));
    const vf magic = vf_set(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits */
    const vf shifted = vf_add(vf_mul(x, vf_set(1.44269504088896341f)), magic);
    const vf n = vf_sub(shifted, magic);
    const vf r = vf_fma(vf_fma(x, n, vf_set(-0.693359375f)), n, vf_set(2.12194440e-4f));
    vf p = vf_set(1.9875691500e-4f);
    p = vf_fma(vf_set(1.3981999507e-3f), p, r);
    p = vf_fma(vf_set(8.3334519073e-3f), p, r);
    p = vf_fma(vf_set(4.1665795894e-2f), p, r);
    p = vf_fma(vf_set(1.6666665459e-1f), p, r);
    p = vf_fma(vf_set(5.0000001201e-1f), p, r);
    const vf e = vf_fma(vf_add(r, vf_set(1.0f)), p, vf_mul(r, r)); /* 1 + r + r^2 p */
    return vf_mul(e, vf_pow2_bits(shifted));
}

/* silu(g) * up, lane by lane */
static inline vf vf_silu_times(vf g, vf up) {
    return vf_mul(vf_div(g, vf_add(vf_set(1.0f), vf_exp(vf_sub(vf_set(0.0f), g)))), up);
}

/* gelu(g) * up, lane by lane, gelu with tanh's approximation (transformers' gelu_pytorch_tanh): 0.5 g (1 + tanh(u)),
 * u = sqrt(2 / pi) (g + 0.044715 g^3), is g / (1 + exp(-2u)) exactly, so it is computed as silu is: vf_exp, then
 * multiplies, adds and a division, the same operations on every lane whatever the row or call */
static inline vf vf_gelu_tanh_times(vf g, vf up) {
    const vf cube = vf_mul(vf_mul(g, g), g);
    const vf minus_2u = vf_mul(vf_set(-1.5957691216057308f), vf_add(g, vf_mul(vf_set(0.044715f), cube)));
    return vf_mul(vf_div(g, vf_add(vf_set(1.0f), vf_exp(minus_2u))), up);
}

/* out[i] = act(gate[i]) * up[i] for i < count (SwiGLU, or GeGLU: `activation` an Activation, interface.h): VL lanes
 * at a time, the last few in a zero-padded vector. Every operation is per lane, so an element's result does not
 * depend on how a row is split into spans. out may lie before gate in the same buffer (each vector is read before
 * it is written). */
static inline vf vf_gated(vf g, vf up, int activation) {
    return activation == ACTIVATION_GELU_TANH ? vf_gelu_tanh_times(g, up) : vf_silu_times(g, up);
}
static inline void gated_span(const float *gate, const float *up, float *out, int64_t count, int activation) {
    int64_t i = 0;
    for (; i + VL <= count; i += VL) vf_store(out + i, vf_gated(vf_load(gate + i), vf_load(up + i), activation));
    if (i < count) {
        float gates[VL] = {0}, ups[VL] = {0}, result[VL];
        memcpy(gates, gate + i, (count - i) * sizeof(float));
        memcpy(ups, up + i, (count - i) * sizeof(float));
        vf_store(result, vf_gated(vf_load(gates), vf_load(ups), activation));
        memcpy(out + i, result, (count - i) * sizeof(float));
    }
}

/* x[i] = cap * tanh(x[i] / cap) for i < count (capped logits), tanh(y) as 2 / (1 + exp(-2y)) - 1 with vf_exp: per
 * lane, the last few in a zero-padded vector, as gated_span */
static inline vf vf_softcap(vf x, float cap) {
    const vf minus_2y = vf_mul(vf_set(-2.0f), vf_div(x, vf_set(cap)));
    const vf tanh_y = vf_sub(vf_div(vf_set(2.0f), vf_add(vf_set(1.0f), vf_exp(minus_2y))), vf_set(1.0f));
    return vf_mul(tanh_y, vf_set(cap));
}
static inline void softcap_span(float *x, int64_t count, float cap) {
    int64_t i = 0;
    for (; i + VL <= count; i += VL) vf_store(x + i, vf_softcap(vf_load(x + i), cap));
    if (i < count) {
        float lanes[VL] = {0};
        memcpy(lanes, x + i, (count - i) * sizeof(float));
        vf_store(lanes, vf_softcap(vf_load(lanes), cap));
        memcpy(x + i, lanes, (count - i) * sizeof(float));
    }
}

/* Element i of a float matrix or norm in its format (a WeightFormat, interface.h), as float32 */
static inline float weight_at(const void *w, int64_t i, int format) {
    if (format == WEIGHTS_BFLOAT16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (format == WEIGHTS_FLOAT16) return f16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

/* ---- integer lanes: the block formats' primitives (matmul_blocks.c) ----
 *
 *   lb   LANES * 4 bytes: a chunk, a pair or a plane's share for the pass
 *   lw   partial integer dots: int16 pairs on AVX2 (vpmaddubsw, widened every few chunks before they could
 *        overflow), int32 elsewhere (vpdpbusd, sdot)
 *   li   LANES int32: exact dots;  lf  LANES float32
 *
 * LANES outputs at a time: 16 with AVX-512 VNNI, 8 with AVX2 and NEON, 4 portable. */

#define ALWAYS static inline __attribute__((always_inline))
typedef int32_t unaligned_i32 __attribute__((may_alias, aligned(1)));  /* 4 activation codes, read as one word */
ALWAYS int32_t quad_at(const int8_t *x) { return *(const unaligned_i32 *)x; }

/* ---- the primitives, per path ---- */

#if defined(EDGE_VNNI)
#define LANES 16
typedef __m512i lb;
typedef __m512i lw;
typedef __m512i li;
typedef __m512 lf;
#define WIDE_LW 1  /* lw holds int32: widen once per run */
ALWAYS lb lb_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
ALWAYS lb lb_low(lb v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
ALWAYS lb lb_high(lb v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
ALWAYS lb lb_or(lb a, lb b) { return _mm512_or_si512(a, b); }
/* (v << s) or (v >> -s) per byte, then & mask: the shifts are 16-bit, and the mask drops what crossed a byte */
ALWAYS lb lb_shift_mask(lb v, const int s, const int mask) {
    const lb shifted = s > 0 ? _mm512_slli_epi16(v, s) : s < 0 ? _mm512_srli_epi16(v, -s) : v;
    return _mm512_and_si512(shifted, _mm512_set1_epi8((char)mask));
}
/* lo | ((plane << s or >> -s) & mask) in one ternary-logic op after the shift (A | (B & C): 0xF8) */
ALWAYS lb lb_merge(lb lo, lb plane, const int s, const int mask) {
    const lb shifted = s > 0 ? _mm512_slli_epi16(plane, s) : s < 0 ? _mm512_srli_epi16(plane, -s) : plane;
    return _mm512_ternarylogic_epi32(lo, shifted, _mm512_set1_epi8((char)mask), 0xF8);
}
ALWAYS lw lw_zero(void) { return _mm512_setzero_si512(); }
/* the 4 codes at x broadcast from memory: folded into vpdpbusd, no port-5 broadcast from a register */
ALWAYS lw lw_dot(lw acc, lb w, const int8_t *x) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(quad_at(x))); }
ALWAYS li li_zero(void) { return _mm512_setzero_si512(); }
ALWAYS li li_set(int32_t v) { return _mm512_set1_epi32(v); }
ALWAYS li li_add(li a, li b) { return _mm512_add_epi32(a, b); }
ALWAYS li li_sub(li a, li b) { return _mm512_sub_epi32(a, b); }
ALWAYS li li_widen(li acc, lw part) { return _mm512_add_epi32(acc, part); }
ALWAYS li li_shl(li v, const int s) { return _mm512_slli_epi32(v, s); }
/* a per-output multiplier (k-quant scales and mins) from LANES bytes, in the form li_widen_by / li_times take */
ALWAYS li li_multiplier(const uint8_t *p, const int is_signed) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    return is_signed ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes);
}
ALWAYS li li_widen_by(li acc, lw part, li multiplier) { return _mm512_add_epi32(acc, _mm512_mullo_epi32(part, multiplier)); }
ALWAYS li li_times(li multiplier, int32_t value) { return _mm512_mullo_epi32(multiplier, _mm512_set1_epi32(value)); }
/* acc + per output the int16 pair at p (2 bytes, unsigned) dotted with the int16 pair in `pair` */
ALWAYS li li_pair_dot(li acc, const uint8_t *p, int32_t pair) {
    const __m512i pairs = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_dpwssd_epi32(acc, pairs, _mm512_set1_epi32(pair));
}
ALWAYS lf lf_zero(void) { return _mm512_setzero_ps(); }
ALWAYS lf lf_set(float v) { return _mm512_set1_ps(v); }
ALWAYS lf lf_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
ALWAYS lf lf_of(li v) { return _mm512_cvtepi32_ps(v); }
ALWAYS lf lf_add(lf a, lf b) { return _mm512_add_ps(a, b); }
ALWAYS lf lf_sub(lf a, lf b) { return _mm512_sub_ps(a, b); }
ALWAYS lf lf_mul(lf a, lf b) { return _mm512_mul_ps(a, b); }
ALWAYS void lf_store(float *p, lf v) { _mm512_storeu_ps(p, v); }
/* Q8_0: signed weights as unsigned bytes w + 128 (the dot then carries 128 * the row's code sum) */
#define Q8_FLIPPED 1
ALWAYS lb lb_q8(lb v) { return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)); }
ALWAYS li li_dot_q8(li acc, lb w, const int8_t *x) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(quad_at(x))); }

#elif defined(EDGE_X86)
#define LANES 8
typedef __m256i lb;
typedef __m256i lw;
typedef __m256i li;
typedef __m256 lf;
#define WIDE_LW 0
ALWAYS lb lb_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
ALWAYS lb lb_low(lb v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
ALWAYS lb lb_high(lb v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
ALWAYS lb lb_or(lb a, lb b) { return _mm256_or_si256(a, b); }
ALWAYS lb lb_shift_mask(lb v, const int s, const int mask) {
    const lb shifted = s > 0 ? _mm256_slli_epi16(v, s) : s < 0 ? _mm256_srli_epi16(v, -s) : v;
    return _mm256_and_si256(shifted, _mm256_set1_epi8((char)mask));
}
ALWAYS lb lb_merge(lb lo, lb plane, const int s, const int mask) { return lb_or(lo, lb_shift_mask(plane, s, mask)); }
ALWAYS lw lw_zero(void) { return _mm256_setzero_si256(); }
/* int16 pairs: unsigned weight bytes times signed activations, adjacent products summed (no saturation: weights are
 * at most 63, so a pair is at most 2 * 63 * 127) */
ALWAYS lw lw_dot(lw acc, lb w, const int8_t *x) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, _mm256_set1_epi32(quad_at(x))));
}
ALWAYS li li_zero(void) { return _mm256_setzero_si256(); }
ALWAYS li li_set(int32_t v) { return _mm256_set1_epi32(v); }
ALWAYS li li_add(li a, li b) { return _mm256_add_epi32(a, b); }
ALWAYS li li_sub(li a, li b) { return _mm256_sub_epi32(a, b); }
ALWAYS li li_widen(li acc, lw part) { return _mm256_add_epi32(acc, _mm256_madd_epi16(part, _mm256_set1_epi16(1))); }
ALWAYS li li_shl(li v, const int s) { return _mm256_slli_epi32(v, s); }
/* the multiplier as int16 pairs (v, v): vpmaddwd multiplies and widens the partial dots in one step */
ALWAYS li li_multiplier(const uint8_t *p, const int is_signed) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)p);
    const __m256i wide = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    return _mm256_or_si256(_mm256_and_si256(wide, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(wide, 16));
}
ALWAYS li li_widen_by(li acc, lw part, li multiplier) { return _mm256_add_epi32(acc, _mm256_madd_epi16(part, multiplier)); }
/* multiplier * value, value within int16 (a run's code sum: at most 32 * 127) */
ALWAYS li li_times(li multiplier, int32_t value) {
    return _mm256_madd_epi16(multiplier, _mm256_set1_epi32(value & 0xFFFF));
}
ALWAYS li li_pair_dot(li acc, const uint8_t *p, int32_t pair) {
    const __m256i pairs = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi32(pair)));
}
ALWAYS lf lf_zero(void) { return _mm256_setzero_ps(); }
ALWAYS lf lf_set(float v) { return _mm256_set1_ps(v); }
ALWAYS lf lf_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
ALWAYS lf lf_of(li v) { return _mm256_cvtepi32_ps(v); }
ALWAYS lf lf_add(lf a, lf b) { return _mm256_add_ps(a, b); }
ALWAYS lf lf_sub(lf a, lf b) { return _mm256_sub_ps(a, b); }
ALWAYS lf lf_mul(lf a, lf b) { return _mm256_mul_ps(a, b); }
ALWAYS void lf_store(float *p, lf v) { _mm256_storeu_ps(p, v); }
/* Q8_0: signed x signed through |w| (unsigned: 128 for a code of -128) and x with w's sign, widened chunk by chunk
 * (a pair is at most 2 * 128 * 127) */
#define Q8_FLIPPED 0
ALWAYS lb lb_q8(lb v) { return v; }
ALWAYS li li_dot_q8(li acc, lb w, const int8_t *codes) {
    const __m256i x = _mm256_set1_epi32(quad_at(codes));
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

#elif defined(EDGE_NEON)
#define LANES 8
typedef uint8x16x2_t lb;
typedef int32x4x2_t li;
typedef li lw;
typedef float32x4x2_t lf;
#define WIDE_LW 1
ALWAYS lb lb_load(const uint8_t *p) { return (lb){{vld1q_u8(p), vld1q_u8(p + 16)}}; }
ALWAYS lb lb_low(lb v) { return (lb){{vandq_u8(v.val[0], vdupq_n_u8(0x0F)), vandq_u8(v.val[1], vdupq_n_u8(0x0F))}}; }
ALWAYS lb lb_high(lb v) { return (lb){{vshrq_n_u8(v.val[0], 4), vshrq_n_u8(v.val[1], 4)}}; }
ALWAYS lb lb_or(lb a, lb b) { return (lb){{vorrq_u8(a.val[0], b.val[0]), vorrq_u8(a.val[1], b.val[1])}}; }
ALWAYS lb lb_shift_mask(lb v, const int s, const int mask) {
    const int8x16_t by = vdupq_n_s8((int8_t)s);  /* vshl: left for s > 0, right for s < 0 */
    return (lb){{vandq_u8(vshlq_u8(v.val[0], by), vdupq_n_u8((uint8_t)mask)),
                 vandq_u8(vshlq_u8(v.val[1], by), vdupq_n_u8((uint8_t)mask))}};
}
ALWAYS lb lb_merge(lb lo, lb plane, const int s, const int mask) { return lb_or(lo, lb_shift_mask(plane, s, mask)); }
ALWAYS li li_zero(void) { return (li){{vdupq_n_s32(0), vdupq_n_s32(0)}}; }
ALWAYS lw lw_zero(void) { return li_zero(); }
/* weights at most 127 are the same bytes signed, so sdot (signed x signed) takes them as they are, Q8_0 too */
ALWAYS int32x4_t dot4(int32x4_t acc, uint8x16_t w, const int8_t *codes) {
    return dot4_s8(acc, vreinterpretq_s8_u8(w), vreinterpretq_s8_s32(vld1q_dup_s32((const int32_t *)(const void *)codes)));
}
ALWAYS lw lw_dot(lw acc, lb w, const int8_t *x) { return (lw){{dot4(acc.val[0], w.val[0], x), dot4(acc.val[1], w.val[1], x)}}; }
ALWAYS li li_set(int32_t v) { return (li){{vdupq_n_s32(v), vdupq_n_s32(v)}}; }
ALWAYS li li_add(li a, li b) { return (li){{vaddq_s32(a.val[0], b.val[0]), vaddq_s32(a.val[1], b.val[1])}}; }
ALWAYS li li_sub(li a, li b) { return (li){{vsubq_s32(a.val[0], b.val[0]), vsubq_s32(a.val[1], b.val[1])}}; }
ALWAYS li li_widen(li acc, lw part) { return li_add(acc, part); }
ALWAYS li li_shl(li v, const int s) { return (li){{vshlq_s32(v.val[0], vdupq_n_s32(s)), vshlq_s32(v.val[1], vdupq_n_s32(s))}}; }
ALWAYS li li_multiplier(const uint8_t *p, const int is_signed) {
    int16x8_t wide;
    if (is_signed) wide = vmovl_s8(vld1_s8((const int8_t *)p));
    else wide = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(p)));
    return (li){{vmovl_s16(vget_low_s16(wide)), vmovl_s16(vget_high_s16(wide))}};
}
ALWAYS li li_widen_by(li acc, lw part, li m) {
    return (li){{vmlaq_s32(acc.val[0], part.val[0], m.val[0]), vmlaq_s32(acc.val[1], part.val[1], m.val[1])}};
}
ALWAYS li li_times(li m, int32_t value) {
    return (li){{vmulq_n_s32(m.val[0], value), vmulq_n_s32(m.val[1], value)}};
}
ALWAYS li li_pair_dot(li acc, const uint8_t *p, int32_t pair) {
    const int16x4_t x = vreinterpret_s16_s32(vdup_n_s32(pair));  /* (first, second) twice */
    const int16x8_t low = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(p))), high = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(p + 8)));
    const int32x4_t a = vpaddq_s32(vmull_s16(vget_low_s16(low), x), vmull_s16(vget_high_s16(low), x));
    const int32x4_t b = vpaddq_s32(vmull_s16(vget_low_s16(high), x), vmull_s16(vget_high_s16(high), x));
    return (li){{vaddq_s32(acc.val[0], a), vaddq_s32(acc.val[1], b)}};
}
ALWAYS lf lf_zero(void) { return (lf){{vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}}; }
ALWAYS lf lf_set(float v) { return (lf){{vdupq_n_f32(v), vdupq_n_f32(v)}}; }
ALWAYS lf lf_f16(const uint16_t *p) {
    return (lf){{vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4)))}};
}
ALWAYS lf lf_of(li v) { return (lf){{vcvtq_f32_s32(v.val[0]), vcvtq_f32_s32(v.val[1])}}; }
ALWAYS lf lf_add(lf a, lf b) { return (lf){{vaddq_f32(a.val[0], b.val[0]), vaddq_f32(a.val[1], b.val[1])}}; }
ALWAYS lf lf_sub(lf a, lf b) { return (lf){{vsubq_f32(a.val[0], b.val[0]), vsubq_f32(a.val[1], b.val[1])}}; }
ALWAYS lf lf_mul(lf a, lf b) { return (lf){{vmulq_f32(a.val[0], b.val[0]), vmulq_f32(a.val[1], b.val[1])}}; }
ALWAYS void lf_store(float *p, lf v) { vst1q_f32(p, v.val[0]), vst1q_f32(p + 4, v.val[1]); }
#define Q8_FLIPPED 0
ALWAYS lb lb_q8(lb v) { return v; }
ALWAYS li li_dot_q8(li acc, lb w, const int8_t *x) { return lw_dot(acc, w, x); }

#else
/* portable: GCC vectors of 4 lanes (SSE2 on x86-64, scalar elsewhere) */
#define LANES 4
typedef uint8_t lb __attribute__((vector_size(16)));
typedef int32_t li __attribute__((vector_size(16)));
typedef li lw;
typedef float lf __attribute__((vector_size(16)));
typedef int8_t vs8 __attribute__((vector_size(16)));
typedef int16_t vs16 __attribute__((vector_size(32)));
#define WIDE_LW 1
ALWAYS lb lb_load(const uint8_t *p) {
    lb v;
    memcpy(&v, p, sizeof v);
    return v;
}
ALWAYS lb lb_low(lb v) { return v & 0x0F; }
ALWAYS lb lb_high(lb v) { return v >> 4; }
ALWAYS lb lb_or(lb a, lb b) { return a | b; }
ALWAYS lb lb_shift_mask(lb v, const int s, const int mask) {
    return (s > 0 ? v << s : s < 0 ? v >> -s : v) & (uint8_t)mask;
}
ALWAYS lb lb_merge(lb lo, lb plane, const int s, const int mask) { return lb_or(lo, lb_shift_mask(plane, s, mask)); }
ALWAYS li li_zero(void) { return (li){0}; }
ALWAYS lw lw_zero(void) { return li_zero(); }
/* 16 signed bytes (weights reinterpreted: those at most 127 are unchanged) times x4 repeated, summed per 4 */
ALWAYS li dot_signed(li acc, vs8 w, const int8_t *x) {
    const vs16 xs = {x[0], x[1], x[2], x[3], x[0], x[1], x[2], x[3], x[0], x[1], x[2], x[3], x[0], x[1], x[2], x[3]};
    const vs16 products = __builtin_convertvector(w, vs16) * xs;
    for (int n = 0; n < LANES; n++)
        acc[n] += (int32_t)products[4 * n] + products[4 * n + 1] + products[4 * n + 2] + products[4 * n + 3];
    return acc;
}
ALWAYS lw lw_dot(lw acc, lb w, const int8_t *x) { return dot_signed(acc, (vs8)w, x); }
ALWAYS li li_set(int32_t v) { return (li){0} + v; }
ALWAYS li li_add(li a, li b) { return a + b; }
ALWAYS li li_sub(li a, li b) { return a - b; }
ALWAYS li li_widen(li acc, lw part) { return acc + part; }
ALWAYS li li_shl(li v, const int s) { return v * (1 << s); }
ALWAYS li li_multiplier(const uint8_t *p, const int is_signed) {
    li m;
    for (int n = 0; n < LANES; n++) m[n] = is_signed ? (int32_t)(int8_t)p[n] : (int32_t)p[n];
    return m;
}
ALWAYS li li_widen_by(li acc, lw part, li m) { return acc + part * m; }
ALWAYS li li_times(li m, int32_t value) { return m * value; }
ALWAYS li li_pair_dot(li acc, const uint8_t *p, int32_t pair) {
    const int32_t first = (int16_t)(pair & 0xFFFF), second = (int16_t)((uint32_t)pair >> 16);
    for (int n = 0; n < LANES; n++) acc[n] += p[2 * n] * first + p[2 * n + 1] * second;
    return acc;
}
ALWAYS lf lf_zero(void) { return (lf){0}; }
ALWAYS lf lf_set(float v) { return (lf){0} + v; }
ALWAYS lf lf_f16(const uint16_t *p) {
    lf v;
    for (int n = 0; n < LANES; n++) v[n] = f16_to_f32(p[n]);
    return v;
}
ALWAYS lf lf_of(li v) { return __builtin_convertvector(v, lf); }
ALWAYS lf lf_add(lf a, lf b) { return a + b; }
ALWAYS lf lf_sub(lf a, lf b) { return a - b; }
ALWAYS lf lf_mul(lf a, lf b) { return a * b; }
ALWAYS void lf_store(float *p, lf v) { memcpy(p, &v, sizeof v); }
#define Q8_FLIPPED 0
ALWAYS lb lb_q8(lb v) { return v; }
ALWAYS li li_dot_q8(li acc, lb w, const int8_t *x) { return dot_signed(acc, (vs8)w, x); }
#endif

/* The kernels' shared entry points (each defined in one .c file of csrc/). A *_share function is one thread's part
 * of the work when a team of `parts` threads runs it (inside one OpenMP parallel region: layers.c runs a whole
 * decode step in one); packed formats read activations the team prepares together first (*_prepare_share). */
void float_matmul_share(int format, const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N,
                        int64_t K, int part, int parts);
void float_matmul_strided_share(int format, const float *x, const void *w, const float *bias, float *y, int64_t ldy,
                                int64_t M, int64_t N, int64_t K, int part, int parts);
int64_t int8_prepared_bytes(int64_t M, int64_t K);
void int8_prepare_share(const float *x, int64_t M, int64_t K, void *prepared, int part, int parts);
void int8_matmul_share(const void *prepared, const uint8_t *packed, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int part, int parts);
void *prepared_alloc(int64_t M, int64_t K);  /* matmul.c: room for M rows' activations in any packed format */
void team_matmul(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                 int format, void *prepared, int part, int parts);
void team_gated_matmul(float *gate_up, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                       int activation, int format, void *prepared, int part, int parts);

#endif
