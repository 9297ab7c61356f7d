/* The matmul entry point for every weights format, one team matmul: the fused layers (layers.c) call team_matmul
 * inside their parallel region; a lone call (rowwise_matmul, edge/kernels/cpu_kernel.py) opens a region of its own
 * around it. Every format takes float32 rows x (M, K) to y (M, N) float32 (+ bias (N), NULL where absent). */
#include <omp.h>
#include <stdlib.h>

#include "blocks.h"
#include "quantized.h"

void *prepared_alloc(int64_t M, int64_t K) {
    const int64_t int8 = int8_prepared_bytes(M, K), blocks = blocks_prepared_bytes(M, K);
    void *prepared = aligned_alloc(64, round_up(int8 > blocks ? int8 : blocks, 64));
    if (prepared == NULL) abort();  /* M rows of int8 codes: far smaller than the weights; nothing to do without */
    return prepared;
}

/* A matmul run by the whole team: the threads prepare a packed format's activations together (and wait for each
 * other), every thread computes its share of the outputs, and all wait until y is complete. Outside a parallel
 * region (one thread) the pragmas are no-ops and it is a plain matmul. */
void team_matmul(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                 int format, void *prepared, int part, int parts) {
    if (format == WEIGHTS_INT8) {
        int8_prepare_share(x, M, K, prepared, part, parts);
        int8_matmul_share(prepared, w, bias, y, M, N, K, part, parts);
    } else if (format == WEIGHTS_BLOCKS) {
        blocks_matmul_team(x, w, bias, y, M, N, K, prepared, part, parts);
    } else {
        float_matmul_share(format, x, w, bias, y, M, N, K, part, parts);
    }
#pragma omp barrier
}

/* act(gate) * up for M rows of (gate | up) (M, 2K), compacted in place into (M, K), split between the team: row m's
 * output [mK, mK + K) overwrites inputs of rows before it, so the team finishes each row before the next. */
static void gated_rows_team(float *gate_up, int64_t M, int64_t K, int activation, int part, int parts) {
    const int64_t vectors = (K + VL - 1) / VL;
    const int64_t begin = vectors * part / parts * VL, end = vectors * (part + 1) / parts * VL;
    const int64_t stop = end < K ? end : K;
    for (int64_t m = 0; m < M; m++) {
        const float *row = gate_up + m * 2 * K;
        if (begin < stop) gated_span(row + begin, row + K + begin, gate_up + m * K + begin, stop - begin, activation);
#pragma omp barrier
    }
}

/* The MLP's down projection of SwiGLU or GeGLU (`activation`, an Activation): act(gate) * up of gate_up (M, 2K),
 * (gate | up) per row, compacted in place into (M, K) float rows, then through w into y (M, N). */
void team_gated_matmul(float *gate_up, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                       int activation, int format, void *prepared, int part, int parts) {
    gated_rows_team(gate_up, M, K, activation, part, parts);
    team_matmul(gate_up, w, bias, y, M, N, K, format, prepared, part, parts);
}

/* One matmul in a parallel region of its own: x (M, K) through w in `format` (WEIGHTS_*; int8 packed as in
 * matmul_int8.c, a BlockMatrix as in matmul_blocks.c) into y (M, N). edge/kernels/cpu_kernel.py calls it for every
 * format. */
void rowwise_matmul(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                    int format, int threads) {
    void *prepared = format == WEIGHTS_INT8 || format == WEIGHTS_BLOCKS ? prepared_alloc(M, K) : NULL;
#pragma omp parallel num_threads(threads)
    team_matmul(x, w, bias, y, M, N, K, format, prepared, omp_get_thread_num(), omp_get_num_threads());
    free(prepared);
}
