/* int8 weights, activations quantized per row (w8a8): y[m, n] = (dot[m, n] * sw[n]) * sx[m] + bias[n], dot the exact
 * integer sum_k xq[m, k] * wq[n, k].
 *
 * Weights are quantized per output channel (wq = round(w / sw), |wq| <= 127; edge/kernels/cpu_kernel.py pack_int8) and
 * packed in groups of 16 outputs: for each group, K'/4 chunks of 64 bytes, chunk c holding wq[n, 4c .. 4c+3] for the
 * group's 16 outputs n in turn (N' = N rounded up to 16 and K' = K rounded up to 4, zero codes in the padding).
 * After the N' * K' code bytes come N' float32 scales sw and N' int32 corrections 128 * sum_k wq[n, k].
 *
 * A chunk is what one instruction takes on every path, 4 products into each output's 32-bit lane:
 *   avx512 with VNNI  vpdpbusd, 16 outputs (unsigned activations xq + 128; the correction takes the 128 back out)
 *   avx2 (and avx512 without VNNI)  |xq| x (wq signed like xq) by vpmaddubsw, pairs summed by vpmaddwd, 8 outputs
 *   neon with dotprod  sdot, 4 outputs; neon  smull then pairwise adds, 4 outputs;  portable  scalar
 * Integer sums are exact in any order and the float steps after them are one scalar epilogue for every path, so each
 * row's result is the same whatever the number of rows, their grouping, the threads or the path: a verify pass
 * reproduces decode steps bit for bit, on every CPU alike.
 */
#include <omp.h>
#include <stdlib.h>

#include "quantized.h"

#define GROUP INT8_GROUP  /* interface.h */
#define MAX_ROWS 4
#define MAX_GROUPS 4 /* groups per tile with one row; fewer with more rows (accumulators stay in registers) */

/* sums[r][g][lane]: the exact dot of row r with output (g0 + g) * 16 + lane, for R rows and G groups */
static inline __attribute__((always_inline)) void dot_tile(const int8_t *xq, const int8_t *magnitudes, int64_t Kp,
                                                          const int8_t *w,
                                                          const int32_t *correction, int64_t g0,
                                                          int32_t sums[MAX_ROWS][MAX_GROUPS][GROUP], const int R,
                                                          const int G) {
    const int64_t chunks = Kp / 4;
    const int8_t *rows[MAX_GROUPS];
    _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) rows[g] = w + (g0 + g) * GROUP * Kp;
#if defined(EDGE_VNNI)
    (void)magnitudes;
    __m512i acc[MAX_ROWS][MAX_GROUPS];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) acc[r][g] = _mm512_setzero_si512();
    const __m512i flip = _mm512_set1_epi32((int32_t)0x80808080);  /* xq + 128 as unsigned bytes */
    for (int64_t c = 0; c < chunks; c++) {
        __m512i xs[MAX_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            int32_t quad;
            memcpy(&quad, xq + r * Kp + c * 4, sizeof quad);
            xs[r] = _mm512_xor_si512(_mm512_set1_epi32(quad), flip);
        }
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {
            const __m512i wv = _mm512_loadu_si512((const void *)(rows[g] + c * 64));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][g] = _mm512_dpbusd_epi32(acc[r][g], xs[r], wv);
        }
    }
    _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {
        const __m512i fix = _mm512_loadu_si512((const void *)(correction + (g0 + g) * GROUP));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            _mm512_storeu_si512((void *)sums[r][g], _mm512_sub_epi32(acc[r][g], fix));
    }
#elif defined(EDGE_X86)
    (void)correction;
    __m256i acc[MAX_ROWS][MAX_GROUPS][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) acc[r][g][0] = acc[r][g][1] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t c = 0; c < chunks; c++) {
        /* one row: each weight vector used once, loaded where used (4 groups: 4 streams, 8 accumulators); more rows:
         * the chunk's weight vectors loaded first, then row by row (accumulators, weights and one row's x in
         * registers) */
        __m256i wv[MAX_GROUPS][2];
        if (R > 1) _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) prefetch_ahead(rows[g] + c * 64);
        if (R > 1)
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
                    wv[g][h] = _mm256_loadu_si256((const __m256i *)(rows[g] + c * 64 + h * 32));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            int32_t quad, magnitude;
            memcpy(&quad, xq + r * Kp + c * 4, sizeof quad);
            memcpy(&magnitude, magnitudes + r * Kp + c * 4, sizeof magnitude);
            const __m256i xs = _mm256_set1_epi32(quad), mags = _mm256_set1_epi32(magnitude);
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                    /* |x| * (w with x's sign) = x * w; a pair of them fits int16 (2 * 127 * 127 < 32768) */
                    const __m256i weights = R > 1 ? wv[g][h]
                                                  : _mm256_loadu_si256((const __m256i *)(rows[g] + c * 64 + h * 32));
                    const __m256i pairs = _mm256_maddubs_epi16(mags, _mm256_sign_epi8(weights, xs));
                    acc[r][g][h] = _mm256_add_epi32(acc[r][g][h], _mm256_madd_epi16(pairs, ones));
                }
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {
            _mm256_storeu_si256((__m256i *)sums[r][g], acc[r][g][0]);
            _mm256_storeu_si256((__m256i *)(sums[r][g] + 8), acc[r][g][1]);
        }
#elif defined(EDGE_NEON)
    (void)correction, (void)magnitudes;
    int32x4_t acc[MAX_ROWS][MAX_GROUPS][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) acc[r][g][q] = vdupq_n_s32(0);
    for (int64_t c = 0; c < chunks; c++) {
        int32_t quads[MAX_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) memcpy(&quads[r], xq + r * Kp + c * 4, 4);
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                const int8x16_t wv = vld1q_s8(rows[g] + c * 64 + q * 16);  /* 4 outputs x 4 codes */
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)  /* simd.h: sdot, or int16 products */
                    acc[r][g][q] = dot4_s8(acc[r][g][q], wv, vreinterpretq_s8_s32(vdupq_n_s32(quads[r])));
            }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) vst1q_s32(sums[r][g] + 4 * q, acc[r][g][q]);
#else
    /* GCC vectors (SSE2 on x86-64): 16 codes (4 outputs x 4 inputs) widened to int16, times the row's 4 activations
     * repeated, summed per lane in int32 over the chunks; each output's 4 lanes added at the end */
    (void)correction, (void)magnitudes;
    typedef int8_t v16i8 __attribute__((vector_size(16)));
    typedef int16_t v16i16 __attribute__((vector_size(32)));
    typedef int32_t v16i32 __attribute__((vector_size(64)));
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) {
            v16i32 lanes[4] = {{0}};
            for (int64_t c = 0; c < chunks; c++) {
                const int8_t *x4 = xq + r * Kp + 4 * c;
                const v16i16 xs = {x4[0], x4[1], x4[2], x4[3], x4[0], x4[1], x4[2], x4[3],
                                   x4[0], x4[1], x4[2], x4[3], x4[0], x4[1], x4[2], x4[3]};
                for (int q = 0; q < 4; q++) {
                    v16i8 codes;
                    memcpy(&codes, rows[g] + c * 64 + 16 * q, sizeof codes);
                    lanes[q] += __builtin_convertvector(__builtin_convertvector(codes, v16i16) * xs, v16i32);
                }
            }
            for (int q = 0; q < 4; q++)
                for (int o = 0; o < 4; o++)
                    sums[r][g][4 * q + o] = lanes[q][4 * o] + lanes[q][4 * o + 1] + lanes[q][4 * o + 2] +
                                            lanes[q][4 * o + 3];
        }
#endif
}

/* The float steps, the same on every path: (dot * sw) * sx + bias, written only for outputs below N. */
static inline void int8_epilogue(int32_t sums[MAX_ROWS][MAX_GROUPS][GROUP], const float *sx, const float *sw,
                                 const float *bias, float *y, int64_t g0, int64_t N, int R, int G) {
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            for (int lane = 0; lane < GROUP; lane++) {
                const int64_t n = (g0 + g) * GROUP + lane;
                if (n < N) y[r * N + n] = ((float)sums[r][g][lane] * sw[n]) * sx[r] + (bias ? bias[n] : 0.0f);
            }
}

#define TILE(R, G)                                                                                              \
    do {                                                                                                        \
        dot_tile(xq + m * Kp, mq + m * Kp, Kp, w, correction, g0, sums, R, G);                                  \
        int8_epilogue(sums, sx + m, sw, bias, y + m * N, g0, N, R, G);                                           \
    } while (0)

/* Activations for the int8 kernel: M rows of K' codes, the same rows' magnitudes |code| (AVX2's vpmaddubsw takes
 * one unsigned operand), then M float scales and M row maxima. */
int64_t int8_prepared_bytes(int64_t M, int64_t K) {
    return 2 * M * round_up(K, 4) + 64 + 2 * M * (int64_t)sizeof(float);
}

/* This thread's part of preparing M rows (inside the team's parallel region; one thread outside it): one thread
 * takes each row's maximum, then every thread quantizes its slice of every row at that row's scale. The codes are
 * those of quantizing each row whole (quantized.h: vector and scalar rounding agree), whatever the split. */
void int8_prepare_share(const float *x, int64_t M, int64_t K, void *prepared, int part, int parts) {
    const int64_t Kp = round_up(K, 4);
    int8_t *xq = prepared, *mq = xq + M * Kp;
    float *sx = (float *)(mq + M * Kp + 64), *tops = sx + M;
#pragma omp single
    {
        memset(mq + M * Kp, 0, 64);  /* the padding after the magnitudes */
        for (int64_t m = 0; m < M; m++) {
            tops[m] = absolute_max(x + m * K, K);
            sx[m] = tops[m] / 127.0f;
        }
    }
    const int64_t lines = (Kp + 63) / 64, begin = lines * part / parts * 64;
    const int64_t end = lines * (part + 1) / parts * 64 < Kp ? lines * (part + 1) / parts * 64 : Kp;
    for (int64_t m = 0; m < M; m++) {
        int8_t *codes = xq + m * Kp, *magnitudes = mq + m * Kp;
        const int64_t inside = end < K ? end : K;  /* [begin, inside) from x, [inside, end) padding */
        if (inside > begin) quantize_with(x + m * K + begin, codes + begin, inside - begin, tops[m]);
        for (int64_t k = inside > begin ? inside : begin; k < end; k++) codes[k] = 0;
        for (int64_t k = begin; k < end; k++) magnitudes[k] = (int8_t)(codes[k] < 0 ? -codes[k] : codes[k]);
    }
#pragma omp barrier
}

/* One thread's share of the outputs (groups of 16 split evenly between `parts` threads), from prepared rows. */
void int8_matmul_share(const void *prepared, const uint8_t *packed, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int part, int parts) {
    const int64_t Np = round_up(N, GROUP), Kp = round_up(K, 4);
    const int8_t *xq = prepared, *mq = xq + M * Kp, *w = (const int8_t *)packed;
    const float *sx = (const float *)(mq + M * Kp + 64);
    const float *sw = (const float *)(packed + Np * Kp);
    const int32_t *correction = (const int32_t *)(packed + Np * Kp + Np * sizeof(float));
    const int64_t groups = Np / GROUP, begin = groups * part / parts, end = groups * (part + 1) / parts;
    int32_t sums[MAX_ROWS][MAX_GROUPS][GROUP];
    for (int64_t first = begin; first < end; first += MAX_GROUPS) {
        const int64_t count = end - first < MAX_GROUPS ? end - first : MAX_GROUPS;
        for (int64_t m = 0; m < M; m += MAX_ROWS) {
            const int rows = M - m < MAX_ROWS ? (int)(M - m) : MAX_ROWS;
            if (rows == 1 && count == MAX_GROUPS) {  /* 1 row x 4 groups, 2 x 2, 3 or 4 x 1: 8 accumulators at most */
                const int64_t g0 = first;
                TILE(1, 4);
            } else if (rows <= 2) {
                for (int64_t g0 = first; g0 < first + count; g0 += 2) {
                    const int pair = first + count - g0 >= 2;
                    if (rows == 1 && pair) TILE(1, 2);
                    else if (rows == 1) TILE(1, 1);
                    else if (pair) TILE(2, 2);
                    else TILE(2, 1);
                }
            } else {
                for (int64_t g0 = first; g0 < first + count; g0++) {
                    if (rows == 3) TILE(3, 1);
                    else TILE(4, 1);
                }
            }
        }
    }
}
