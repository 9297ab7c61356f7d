/* The matmul entry point for every weights format, one team matmul: the fused layers (layers.c) call team_matmul
 * inside their parallel region; a lone call (rowwise_matmul, kernels/cpu_matmul.py) opens a region of its own
 * around it. Every format takes float32 rows x (M, K) to y (M, N) float32 (+ bias (N), NULL where absent). */
#include <omp.h>
#include <stdlib.h>

#include "simd.h"

void *prepared_alloc(int64_t M, int64_t K) {
    const int64_t int8 = int8_prepared_bytes(M, K), int4 = int4_prepared_bytes(M, K);
    void *prepared = malloc(int8 > int4 ? int8 : int4);
    if (prepared == NULL) abort();  /* M rows of int8 codes: far smaller than the weights; nothing to do without */
    return prepared;
}

/* A matmul run by the whole team: the threads prepare a packed format's activations together (and wait for each
 * other), every thread computes its share of the outputs, and all wait until y is complete. Outside a parallel
 * region (one thread) the pragmas are no-ops and it is a plain matmul. */
void team_matmul(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                 int format, void *prepared, int part, int parts) {
    if (format == WEIGHTS_I8) {
        int8_prepare_share(x, M, K, prepared, part, parts);
        int8_matmul_share(prepared, w, bias, y, M, N, K, part, parts);
    } else if (format == WEIGHTS_I4) {
        int4_prepare_share(x, M, K, prepared, part, parts);
        int4_matmul_share(prepared, w, bias, y, M, N, K, part, parts);
    } else {
        float_matmul_share(format, x, w, bias, y, M, N, K, part, parts);
    }
#pragma omp barrier
}

/* One matmul in a parallel region of its own: x (M, K) through w in `format` (WEIGHTS_*; int8 and int4 packed as in
 * matmul_int8.c and matmul_int4.c) into y (M, N). kernels/cpu_matmul.py calls it for every format. */
void rowwise_matmul(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                    int format, int threads) {
    void *prepared = format == WEIGHTS_I8 || format == WEIGHTS_I4 ? prepared_alloc(M, K) : NULL;
#pragma omp parallel num_threads(threads)
    team_matmul(x, w, bias, y, M, N, K, format, prepared, omp_get_thread_num(), omp_get_num_threads());
    free(prepared);
}
