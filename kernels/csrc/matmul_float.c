/* Batch-invariant small-batch matmul for CPU decoding: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), weights
 * float32, bfloat16 or float16 (16-bit ones widened exactly in registers), inputs and outputs float32.
 *
 * Every output element is one dot product computed in the same order whatever the number of rows M, the row's
 * index or the thread count: four VL-lane accumulators taking k in chunks of VL in turn (a fused multiply-add each,
 * on the paths that have FMA), added as (a0 + a1) + (a2 + a3), simd.h's fixed lane reduction, a scalar tail for
 * k % 4VL, then + bias. So a (k + 1)-row verify pass produces bit for bit the rows that k + 1 single-row decode
 * steps produce, which makes greedy speculative decoding exactly equal to plain decoding (vendor BLAS picks
 * different kernels for 1 and for 5 rows, and they round differently).
 *
 * Each thread takes a contiguous range of outputs and reads their weight rows one after another: one sequential
 * stream per thread, which the hardware prefetcher follows at full speed (several rows read side by side measured
 * 15-20% slower on an AVX2 server: short interleaved streams). Each weight row is used for every input row while it
 * is in L1 (ROW_GROUP input rows per pass, four accumulators each: 8 FMA chains on AVX2's 16 registers, 16 on the
 * 32 of AVX-512 and NEON), so it is read from memory once per call whatever the number of rows, and a verify pass
 * costs little more than a decode step when decoding is bound by weight reads.
 *
 * The build passes -ffp-contract=off, so the compiler never fuses (or declines to fuse) a multiply and an add on its
 * own, which it could do differently in the 4-row loop and the 1-row loop: fusion is explicit (vf_fma).
 */
#include <omp.h>

#include "simd.h"

#if defined(EDGE_AVX2)
#define ROW_GROUP 2
#else
#define ROW_GROUP 4
#endif
#define CHAINS 4

enum { F32 = 0, BF16 = 1, F16 = 2 };

static inline __attribute__((always_inline)) vf load_weights(const void *w, int64_t i, const int format) {
    if (format == BF16) return vf_load_bf16((const uint16_t *)w + i);
    if (format == F16) return vf_load_f16((const uint16_t *)w + i);
    return vf_load((const float *)w + i);
}

static inline __attribute__((always_inline)) float weight_scalar(const void *w, int64_t i, const int format) {
    if (format == BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (format == F16) return f16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

/* Output n for R input rows (x + r * K), R a compile-time constant. */
static inline __attribute__((always_inline)) void float_dots(const float *x, const void *w, const float *bias,
                                                             float *y, int64_t n, int64_t N, int64_t K, const int R,
                                                             const int format, const int ahead) {
    vf acc[ROW_GROUP][CHAINS];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < CHAINS; c++) acc[r][c] = vf_zero();
    const int64_t row = n * K;
    int64_t k = 0;
    const int64_t size = format == F32 ? 4 : 2;
    for (; k + CHAINS * VL <= K; k += CHAINS * VL) {
        if (ahead)  /* the first pass of a call with more rows than one pass takes (simd.h: prefetch_ahead) */
            for (int64_t line = 0; line < CHAINS * VL * size; line += 64)
                prefetch_ahead((const char *)w + (row + k) * size + line);
        _Pragma("GCC unroll 4") for (int c = 0; c < CHAINS; c++) {
            const vf wv = load_weights(w, row + k + c * VL, format);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                acc[r][c] = vf_fma(acc[r][c], vf_load(x + r * K + k + c * VL), wv);
        }
    }
    float sums[ROW_GROUP];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        sums[r] = vf_reduce(vf_add(vf_add(acc[r][0], acc[r][1]), vf_add(acc[r][2], acc[r][3])));
    for (; k < K; k++) {
        const float wk = weight_scalar(w, row + k, format);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sums[r] = sums[r] + x[r * K + k] * wk;
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r * N + n] = sums[r] + (bias ? bias[n] : 0.0f);
}

/* Outputs [first, end) for all M rows: per output, its weight row against every group of up to ROW_GROUP rows. */
static inline __attribute__((always_inline)) void float_outputs(const float *x, const void *w, const float *bias,
                                                                float *y, int64_t first, int64_t end, int64_t M,
                                                                int64_t N, int64_t K, const int format) {
    for (int64_t n = first; n < end; n++)
        for (int64_t m = 0; m < M; m += ROW_GROUP) {
            const float *xm = x + m * K;
            float *ym = y + m * N;
            const int ahead = m == 0 && M > 1;
            switch (M - m < ROW_GROUP ? M - m : ROW_GROUP) {
                case 1: float_dots(xm, w, bias, ym, n, N, K, 1, format, ahead); break;
#if ROW_GROUP == 4
                case 2: float_dots(xm, w, bias, ym, n, N, K, 2, format, ahead); break;
                case 3: float_dots(xm, w, bias, ym, n, N, K, 3, format, ahead); break;
                default: float_dots(xm, w, bias, ym, n, N, K, 4, format, ahead); break;
#else
                default: float_dots(xm, w, bias, ym, n, N, K, 2, format, ahead); break;
#endif
            }
        }
}

/* One thread's share of the outputs (split evenly between `parts` threads): format 0 float32, 1 bfloat16, 2
 * float16. */
void float_matmul_share(int format, const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N,
                        int64_t K, int part, int parts) {
    const int64_t first = N * part / parts, end = N * (part + 1) / parts;
    if (format == BF16) float_outputs(x, w, bias, y, first, end, M, N, K, BF16);
    else if (format == F16) float_outputs(x, w, bias, y, first, end, M, N, K, F16);
    else float_outputs(x, w, bias, y, first, end, M, N, K, F32);
}

#define DEFINE_FLOAT_MATMUL(NAME, WTYPE, FORMAT)                                                                 \
    void NAME(const float *x, const WTYPE *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,     \
              int threads) {                                                                                    \
        _Pragma("omp parallel num_threads(threads)")                                                            \
        float_matmul_share(FORMAT, x, w, bias, y, M, N, K, omp_get_thread_num(), omp_get_num_threads());      \
    }

DEFINE_FLOAT_MATMUL(rowwise_matmul_f32, float, F32)
DEFINE_FLOAT_MATMUL(rowwise_matmul_bf16, uint16_t, BF16)
DEFINE_FLOAT_MATMUL(rowwise_matmul_f16, uint16_t, F16)

/* What the machine reads: sums `count` floats in `threads` contiguous slices (kernels/bench.py's bandwidth probe,
 * the reference for the matmuls' GB/s). */
double read_bandwidth_probe(const float *data, int64_t count, int threads) {
    double total = 0.0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
    for (int64_t part = 0; part < threads; part++) {
        const int64_t begin = count * part / threads, end = count * (part + 1) / threads;
        vf a = vf_zero(), b = vf_zero(), c = vf_zero(), d = vf_zero();
        int64_t i = begin;
        for (; i + 4 * VL <= end; i += 4 * VL) {
            a = vf_add(a, vf_load(data + i));
            b = vf_add(b, vf_load(data + i + VL));
            c = vf_add(c, vf_load(data + i + 2 * VL));
            d = vf_add(d, vf_load(data + i + 3 * VL));
        }
        float rest = 0.0f;
        for (; i < end; i++) rest += data[i];
        total += (double)vf_reduce(vf_add(vf_add(a, b), vf_add(c, d))) + rest;
    }
    return total;
}

const char *kernel_path(void) { return EDGE_PATH; }
