/* Batch-invariant small-batch matmul for CPU decoding: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), weights
 * float32, bfloat16 or float16 (16-bit ones widened exactly in registers), inputs and outputs float32.
 *
 * Every output element is one dot product computed in the same order whatever the number of rows M, the row's
 * index or the thread count: one VL-lane accumulator over k in steps of VL (a fused multiply-add each, on the
 * paths that have FMA), a scalar tail for k % VL, then simd.h's fixed lane reduction, + tail + bias. So a
 * (k + 1)-row verify pass produces bit for bit the rows that k + 1 single-row decode steps produce, which makes
 * greedy speculative decoding exactly equal to plain decoding (vendor BLAS picks different kernels for 1 and for
 * 5 rows, and they round differently).
 *
 * Outputs go in panels of 8 weight rows, split between the threads; inside a panel up to 4 input rows share each
 * weight load: each weight is read from memory once per call whatever the number of rows (a panel's rows stay in
 * cache while later groups of input rows reuse them), so a verify pass costs little more than a decode step when
 * decoding is bound by weight reads. How rows and outputs are grouped changes nothing in any one dot product.
 * Accumulators: 1 row x 8 outputs, 2 x 4, 3 x 2 or 4 x 2, at most 8 independent FMA chains in registers.
 *
 * The build passes -ffp-contract=off, so the compiler never fuses (or declines to fuse) a multiply and an add on its
 * own, which it could do differently in the 4-row loop and the 1-row loop: fusion is explicit (vf_fma).
 */
#include "simd.h"

#define PANEL 8
#define MAX_ROWS 4

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

/* R input rows (x + r * K) against G weight rows from n0, R and G compile-time constants. */
static inline __attribute__((always_inline)) void float_block(const float *x, const void *w, const float *bias,
                                                              float *y, int64_t n0, int64_t N, int64_t K, const int R,
                                                              const int G, const int format) {
    vf acc[MAX_ROWS][PANEL];
    float tail[MAX_ROWS][PANEL];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) {
            acc[r][g] = vf_zero();
            tail[r][g] = 0.0f;
        }
    int64_t k = 0;
    for (; k + VL <= K; k += VL) {
        vf xs[MAX_ROWS];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) xs[r] = vf_load(x + r * K + k);
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) {
            const vf wv = load_weights(w, (n0 + g) * K + k, format);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][g] = vf_fma(acc[r][g], xs[r], wv);
        }
    }
    for (; k < K; k++)
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) {
            const float wk = weight_scalar(w, (n0 + g) * K + k, format);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) tail[r][g] = tail[r][g] + x[r * K + k] * wk;
        }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++)
            y[r * N + n0 + g] = (vf_reduce(acc[r][g]) + tail[r][g]) + (bias ? bias[n0 + g] : 0.0f);
}

/* One panel of outputs [n0, n0 + PANEL) (fewer at the end) for all M rows, in groups of up to MAX_ROWS rows. */
static inline __attribute__((always_inline)) void float_panel(const float *x, const void *w, const float *bias,
                                                              float *y, int64_t n0, int64_t M, int64_t N, int64_t K,
                                                              const int format) {
    for (int64_t m = 0; m < M; m += MAX_ROWS) {
        const int rows = M - m < MAX_ROWS ? (int)(M - m) : MAX_ROWS;
        const float *xm = x + m * K;
        float *ym = y + m * N;
        if (N - n0 >= PANEL) {
            switch (rows) {
                case 1: float_block(xm, w, bias, ym, n0, N, K, 1, 8, format); break;
                case 2: for (int j = 0; j < PANEL; j += 4) float_block(xm, w, bias, ym, n0 + j, N, K, 2, 4, format);
                        break;
                case 3: for (int j = 0; j < PANEL; j += 2) float_block(xm, w, bias, ym, n0 + j, N, K, 3, 2, format);
                        break;
                default: for (int j = 0; j < PANEL; j += 2) float_block(xm, w, bias, ym, n0 + j, N, K, 4, 2, format);
                        break;
            }
        } else {
            for (int64_t n = n0; n < N; n++) switch (rows) {
                case 1: float_block(xm, w, bias, ym, n, N, K, 1, 1, format); break;
                case 2: float_block(xm, w, bias, ym, n, N, K, 2, 1, format); break;
                case 3: float_block(xm, w, bias, ym, n, N, K, 3, 1, format); break;
                default: float_block(xm, w, bias, ym, n, N, K, 4, 1, format); break;
            }
        }
    }
}

#define DEFINE_FLOAT_MATMUL(NAME, WTYPE, FORMAT)                                                                 \
    void NAME(const float *x, const WTYPE *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,     \
              int threads) {                                                                                    \
        const int64_t panels = (N + PANEL - 1) / PANEL;                                                         \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                                      \
        for (int64_t p = 0; p < panels; p++) float_panel(x, w, bias, y, p * PANEL, M, N, K, FORMAT);          \
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
