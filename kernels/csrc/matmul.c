/* The matmul entry points, one per weights format, over one team matmul: the fused layers (layers.c) call
 * team_matmul inside their parallel region; a lone call (rowwise_matmul_*, kernels/cpu_matmul.py) opens a region of
 * its own around it. Every format takes float32 rows x (M, K) to y (M, N) float32 (+ bias (N), NULL where absent). */
#include <omp.h>
#include <stdlib.h>

#include "simd.h"

int64_t prepared_bytes(int64_t M, int64_t K) {
    const int64_t int8 = int8_prepared_bytes(M, K), int4 = int4_prepared_bytes(M, K);
    return int8 > int4 ? int8 : int4;
}

void *prepared_alloc(int64_t M, int64_t K) {
    void *prepared = malloc(prepared_bytes(M, K));
    if (prepared == NULL) abort();  /* a few KiB: out of memory here leaves nothing sensible to compute */
    return prepared;
}

/* A matmul run by the whole team: one thread prepares a packed format's activations (the others wait), every
 * thread computes its share of the outputs, and all wait until y is complete. Outside a parallel region (one
 * thread) the pragmas are no-ops and it is a plain matmul. */
void team_matmul(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                 int format, void *prepared, int part, int parts) {
    if (format == WEIGHTS_I8 || format == WEIGHTS_I4) {
#pragma omp single
        {
            if (format == WEIGHTS_I8) int8_prepare(x, M, K, prepared);
            else int4_prepare(x, M, K, prepared);
        }
    }
    if (format == WEIGHTS_I8) int8_matmul_share(prepared, w, bias, y, M, N, K, part, parts);
    else if (format == WEIGHTS_I4) int4_matmul_share(prepared, w, bias, y, M, N, K, part, parts);
    else float_matmul_share(format, x, w, bias, y, M, N, K, part, parts);
#pragma omp barrier
}

void matmul_call(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                 int format, int threads) {
    void *prepared = format == WEIGHTS_I8 || format == WEIGHTS_I4 ? prepared_alloc(M, K) : NULL;
#pragma omp parallel num_threads(threads)
    team_matmul(x, w, bias, y, M, N, K, format, prepared, omp_get_thread_num(), omp_get_num_threads());
    free(prepared);
}

void rowwise_matmul_f32(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                        int threads) {
    matmul_call(x, w, bias, y, M, N, K, WEIGHTS_F32, threads);
}

void rowwise_matmul_bf16(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N,
                         int64_t K, int threads) {
    matmul_call(x, w, bias, y, M, N, K, WEIGHTS_BF16, threads);
}

void rowwise_matmul_f16(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M, int64_t N,
                        int64_t K, int threads) {
    matmul_call(x, w, bias, y, M, N, K, WEIGHTS_F16, threads);
}

/* packed int8 weights: matmul_int8.c's layout */
void rowwise_matmul_i8(const float *x, const uint8_t *packed, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads) {
    matmul_call(x, packed, bias, y, M, N, K, WEIGHTS_I8, threads);
}

/* packed int4 weights: matmul_int4.c's layout */
void rowwise_matmul_i4(const float *x, const uint8_t *packed, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads) {
    matmul_call(x, packed, bias, y, M, N, K, WEIGHTS_I4, threads);
}
