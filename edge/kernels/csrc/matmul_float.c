/* Batch-invariant small-batch matmul for CPU decoding: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), weights
 * float32, bfloat16 or float16 (16-bit ones widened exactly in registers), inputs and outputs float32.
 *
 * Every output element is one dot product computed in the same order whatever the number of rows M, the row's
 * index or the thread count: one VL-lane accumulator over k in steps of VL (a fused multiply-add each, on the paths
 * that have FMA), simd.h's fixed lane reduction, a scalar tail for k % VL, then + bias. So a (k + 1)-row verify pass
 * produces bit for bit the rows that k + 1 single-row decode steps produce, which makes greedy speculative decoding
 * exactly equal to plain decoding (vendor BLAS picks different kernels for 1 and for 5 rows, and they round
 * differently).
 *
 * Each thread takes a contiguous range of outputs; float_outputs says how it walks them (a few long sequential
 * weight streams, not many short ones: several adjacent rows read side by side measured 15-20% slower). Each
 * weight row is used for every input row while it is in L1, so it is read from memory once per call whatever the
 * number of rows, and a verify pass costs little more than a decode step when decoding is bound by weight reads.
 *
 * The build passes -ffp-contract=off, so the compiler never fuses (or declines to fuse) a multiply and an add on its
 * own, which it could do differently in the 4-row loop and the 1-row loop: fusion is explicit (vf_fma).
 */
#include <omp.h>

#include "simd.h"

#define STREAMS 4   /* at most: outputs from separate parts of a thread's range read side by side */
#define ROW_GROUP 5 /* the most input rows one pass takes (array sizes): groups of 4, or 5 for a 5-row call */


static inline __attribute__((always_inline)) vf load_weights(const void *w, int64_t i, const int format) {
    if (format == WEIGHTS_BFLOAT16) return vf_load_bf16((const uint16_t *)w + i);
    if (format == WEIGHTS_FLOAT16) return vf_load_f16((const uint16_t *)w + i);
    return vf_load((const float *)w + i);
}

/* Outputs n[0 .. S) for R input rows (x + r * K), R and S compile-time constants, R * S <= 12 accumulators: each
 * output alone is one lane-wise chain over k, the lane reduction, the tail, the bias. Each row's x vector is loaded
 * once for the S outputs. */
static inline __attribute__((always_inline)) void float_dots(const float *x, const void *w, const float *bias,
                                                             float *y, const int64_t *n, int64_t ldy, int64_t K,
                                                             const int R, const int S, const int format,
                                                             const int ahead) {
    vf acc[ROW_GROUP][STREAMS];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) acc[r][s] = vf_zero();
    int64_t row[STREAMS];
    _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) row[s] = n[s] * K;
    const int64_t size = format == WEIGHTS_FLOAT32 ? 4 : 2;
    int64_t k = 0;
    for (; k + VL <= K; k += VL) {
        if (ahead && (k * size) % 64 == 0)  /* the first pass of a call with several rows (simd.h: prefetch_ahead) */
            _Pragma("GCC unroll 8") for (int s = 0; s < S; s++)
                prefetch_ahead((const char *)w + (row[s] + k) * size);
        vf xs[ROW_GROUP];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) xs[r] = vf_load(x + r * K + k);
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) {
            const vf wv = load_weights(w, row[s] + k, format);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r][s] = vf_fma(acc[r][s], xs[r], wv);
        }
    }
    _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) {
        float sums[ROW_GROUP];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sums[r] = vf_reduce(acc[r][s]);
        for (int64_t j = k; j < K; j++) {
            const float wk = weight_at(w, row[s] + j, format);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sums[r] = sums[r] + x[r * K + j] * wk;
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
            y[r * ldy + n[s]] = sums[r] + (bias ? bias[n[s]] : 0.0f);
    }
}

/* Outputs [first, end) for all M rows, S outputs at a time from S equal parts of the range, so the thread reads S
 * long sequential weight streams (one core keeps more reads in flight: 23.8 -> 30 GB/s over TinyLlama's float16
 * matrices on an AVX2 server with 4 streams against 1; 8 measured 5% slower) and loads each x vector once for S
 * outputs: 4 streams for one or two rows, 3 for more, whose rows go in groups of up to 4 against the same weight rows
 * (read from memory in the first group, from L1 after). Three streams give 4 rows 12 independent accumulators: the
 * 500M benchmark target's 4-row float16 pass took 39-40 ms against 42-44 with 2 (8 chains of 4-cycle FMAs), its
 * 64-row pass 555-559 against 583-584 ms (Zen 3, AVX2; 3 rows on par, 6 rows in 2 streams were slower). A 5-row call
 * (a verify pass of 4 drafted tokens) goes as one group against 2 outputs (10 chains) instead of 4 rows and then 1,
 * which read every weight row twice: 47-49 against 58-67 ms on that target, 1.6-2.3 against 2.1-2.5 ms on the
 * built-in model. Longer calls keep groups of 4 in 3 streams. The few outputs left over go one at a time. */
#define DOTS(R, S) float_dots(xm, w, bias, ym, outputs, ldy, K, R, S, format, ahead)
static inline __attribute__((always_inline)) void float_outputs(const float *x, const void *w, const float *bias,
                                                                float *y, int64_t first, int64_t end, int64_t M,
                                                                int64_t ldy, int64_t K, const int format) {
    const int streams = M <= 2 ? 4 : M == 5 ? 2 : 3;
    const int group = M == 5 ? 5 : 4;
    const int64_t part = (end - first) / streams;
    for (int64_t n = first; n < end; n++) {
        const int tuple = n < first + part;  /* n and its partners in the other parts, or one left over */
        if (!tuple && n < first + streams * part) continue;
        int64_t outputs[STREAMS];
        for (int s = 0; s < streams; s++) outputs[s] = n + s * part;
        for (int64_t m = 0; m < M; m += group) {
            const float *xm = x + m * K;
            float *ym = y + m * ldy;
            const int ahead = m == 0 && M > 1, rows = M - m < group ? (int)(M - m) : group;
            if (rows == 5) {
                if (tuple) DOTS(5, 2);
                else DOTS(5, 1);
            } else if (!tuple) {
                if (rows == 1) DOTS(1, 1);
                else if (rows == 2) DOTS(2, 1);
                else if (rows == 3) DOTS(3, 1);
                else DOTS(4, 1);
            } else if (streams == 4) {
                if (rows == 1) DOTS(1, 4);
                else DOTS(2, 4);
            } else {
                if (rows == 1) DOTS(1, 3);
                else if (rows == 2) DOTS(2, 3);
                else if (rows == 3) DOTS(3, 3);
                else DOTS(4, 3);
            }
        }
    }
}
#undef DOTS

/* One thread's share of the outputs (split evenly between `parts` threads): format 0 float32, 1 bfloat16, 2
 * float16; row m of y at y + m * ldy (ldy >= N: a segment of a wider output, csrc/matmul_blocks.c). */
void float_matmul_strided_share(int format, const float *x, const void *w, const float *bias, float *y, int64_t ldy,
                                int64_t M, int64_t N, int64_t K, int part, int parts) {
    const int64_t first = N * part / parts, end = N * (part + 1) / parts;
    if (format == WEIGHTS_BFLOAT16) float_outputs(x, w, bias, y, first, end, M, ldy, K, WEIGHTS_BFLOAT16);
    else if (format == WEIGHTS_FLOAT16) float_outputs(x, w, bias, y, first, end, M, ldy, K, WEIGHTS_FLOAT16);
    else float_outputs(x, w, bias, y, first, end, M, ldy, K, WEIGHTS_FLOAT32);
}

void float_matmul_share(int format, const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N,
                        int64_t K, int part, int parts) {
    float_matmul_strided_share(format, x, w, bias, y, N, M, N, K, part, parts);
}

/* Sums `length` floats from each of S streams (S a compile-time constant), two vectors per stream per step. */
static inline __attribute__((always_inline)) float stream_sum(const float *data, int64_t length, const int S) {
    vf sums[8][2];
    _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) sums[s][0] = sums[s][1] = vf_zero();
    for (int64_t i = 0; i + 2 * VL <= length; i += 2 * VL)
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) {
            sums[s][0] = vf_add(sums[s][0], vf_load(data + s * length + i));
            sums[s][1] = vf_add(sums[s][1], vf_load(data + s * length + i + VL));
        }
    vf all = vf_zero();
    _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) all = vf_add(all, vf_add(sums[s][0], sums[s][1]));
    return vf_reduce(all);
}

/* What the machine reads: sums `count` floats, each of `threads` threads a contiguous slice of them read as `streams`
 * (1, 2, 4 or 8) interleaved sequential streams (edge/kernels/cpu_kernel.py read_bandwidth takes the best of several
 * stream counts: the reference for the matmuls' GB/s). */
double read_bandwidth_probe(const float *data, int64_t count, int threads, int streams) {
    double total = 0.0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
    for (int64_t part = 0; part < threads; part++) {
        const int64_t begin = count * part / threads, length = (count * (part + 1) / threads - begin) / streams;
        switch (streams) {
            case 1: total += stream_sum(data + begin, length, 1); break;
            case 2: total += stream_sum(data + begin, length, 2); break;
            case 4: total += stream_sum(data + begin, length, 4); break;
            default: total += stream_sum(data + begin, length, 8); break;
        }
    }
    return total;
}

const char *kernel_path(void) { return EDGE_PATH; }
