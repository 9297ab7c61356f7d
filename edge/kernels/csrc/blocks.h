/* llama.cpp's block quantizations (GGUF tensor types) as kernel formats: the file's values, rearranged once at load
 * into groups of 16 outputs so that a vector lane is an output (as the int8 format is), never re-quantized.
 *
 * A GGUF row of K weights is K / B blocks of B weights (B = 32, or 256 for the k-quants); each block holds integer
 * codes and float16 scales. Layout here: outputs in groups of 16 (the last padded with zero bytes, which every type
 * decodes as 0), and for each group the blocks along K in order, each block the 16 outputs' codes and scales side by
 * side. Within a block codes come in chunks: chunk c of a run of 32 weights is k = 4c .. 4c + 3 for the 16 outputs in
 * turn (64 values, output n at 4n .. 4n + 3), what one dot instruction takes per output lane.
 *
 *   pair      64 bytes: chunk 2p's low 4 bits in the low nibbles, chunk 2p + 1's in the high nibbles (p = 0 .. 3 for a
 *             run of 32 weights)
 *   plane     64 bytes of higher bits beside the pairs: 5-bit types, bit c of byte 4n + i is bit 4 of chunk c's
 *             value (n, i) (c = 0 .. 7); Q6_K, bits 2c, 2c + 1 are bits 4, 5 of chunk c's (c = 0 .. 3 of a run of
 *             16 weights)
 *
 *   type  B    weights                              bytes per group and block (16 outputs)     value
 *   Q8_0  32   8 chunks of int8 codes                 512 + 16 f16 d                   = 544   d q
 *   Q4_0  32   4 pairs                                256 + 16 d                       = 288   d (q - 8)
 *   Q4_1  32   4 pairs                                256 + 16 d + 16 f16 m            = 320   d q + m
 *   Q5_0  32   4 pairs + a plane                      320 + 16 d                       = 352   d (q - 16)
 *   Q5_1  32   4 pairs + a plane                      320 + 16 d + 16 m                = 384   d q + m
 *   Q4_K  256  8 runs of 32: 4 pairs each            2048 + 8x16 scales + 8x16 mins
 *                                                          + 16 f16 d + 16 f16 dmin     = 2368  d sc_j q - dmin m_j
 *   Q5_K  256  8 runs of 32: 4 pairs + a plane       2560 + 128 + 128 + 64             = 2880  d sc_j q - dmin m_j
 *   Q6_K  256  16 runs of 16: 2 pairs + a plane      3072 + 16x16 int8 scales + 16 d  = 3360  d sc_j (q - 32)
 *
 * (k-quant scales and mins: 6 bits each in the file, one byte each here. Scales: sub-block j's 16 bytes, output n
 * at n. Mins in pairs of sub-blocks, for one int16 multiply-add per pair: pair i's 32 bytes hold output n's mins of
 * sub-blocks 2i and 2i + 1 at 2n, 2n + 1.)
 * Every type but Q4_K and Q5_K takes exactly the file's bytes; those two take 64 bytes more per 2304 / 2816 (2.8%,
 * 2.3%), the 6-bit scales and mins unpacked into bytes.
 */
#ifndef EDGE_BLOCKS_H
#define EDGE_BLOCKS_H

#include <stdint.h>

/* a segment's format: ggml's own type number (GGUF's tensor_type). F32, F16 and BF16 segments (a matrix a quantized
 * file keeps in floats) keep the file's row-major layout and run on the float kernel (matmul_float.c). */
enum {
    BLOCKS_F32 = 0, BLOCKS_F16 = 1, BLOCKS_Q4_0 = 2, BLOCKS_Q4_1 = 3, BLOCKS_Q5_0 = 6, BLOCKS_Q5_1 = 7,
    BLOCKS_Q8_0 = 8, BLOCKS_Q4_K = 12, BLOCKS_Q5_K = 13, BLOCKS_Q6_K = 14, BLOCKS_BF16 = 30,
};
#define BLOCKS_GROUP 16
static inline int blocks_k_quant(int format) { return format >= BLOCKS_Q4_K && format <= BLOCKS_Q6_K; }
static inline int blocks_float(int format) {
    return format == BLOCKS_F32 || format == BLOCKS_F16 || format == BLOCKS_BF16;
}

/* A matrix of the fused calls' WEIGHTS_BLOCKS format: up to 4 row segments, each in its own block format (a fused
 * q/k/v projection whose v is Q6_K beside Q4_K q and k), stacked: segment s's outputs follow segment s - 1's. */
#define BLOCKS_MAX_SEGMENTS 4
typedef struct {
    int32_t count;
    int32_t formats[BLOCKS_MAX_SEGMENTS];
    int64_t rows[BLOCKS_MAX_SEGMENTS];
    const uint8_t *data[BLOCKS_MAX_SEGMENTS];
} BlockMatrix;

/* B: weights per block (1 for the float formats) */
static inline int64_t block_weights(int format) { return blocks_k_quant(format) ? 256 : blocks_float(format) ? 1 : 32; }

/* one output's block in the file (0: not a block format edge runs) */
static inline int64_t block_file_bytes(int format) {
    switch (format) {
        case BLOCKS_Q8_0: return 34;
        case BLOCKS_Q4_0: return 18;
        case BLOCKS_Q4_1: return 20;
        case BLOCKS_Q5_0: return 22;
        case BLOCKS_Q5_1: return 24;
        case BLOCKS_Q4_K: return 144;
        case BLOCKS_Q5_K: return 176;
        case BLOCKS_Q6_K: return 210;
        case BLOCKS_F32: return 4;
        case BLOCKS_F16: case BLOCKS_BF16: return 2;
        default: return 0;
    }
}

/* one group's block here (the float formats are not grouped: blocks_packed_bytes) */
static inline int64_t block_group_bytes(int format) {
    switch (format) {
        case BLOCKS_Q8_0: return 544;
        case BLOCKS_Q4_0: return 288;
        case BLOCKS_Q4_1: return 320;
        case BLOCKS_Q5_0: return 352;
        case BLOCKS_Q5_1: return 384;
        case BLOCKS_Q4_K: return 2368;
        case BLOCKS_Q5_K: return 2880;
        case BLOCKS_Q6_K: return 3360;
        default: return 0;
    }
}

int64_t blocks_packed_bytes(int format, int64_t N, int64_t K);

/* blocks_layout.c */
void blocks_repack(int format, const uint8_t *file, int64_t N, int64_t K, uint8_t *packed, int threads);
void blocks_dequantize_rows(int format, const uint8_t *packed, int64_t K, int64_t first, int64_t count, float *out);
void block_matrix_row(const BlockMatrix *matrix, int64_t K, int64_t row, float *out);

/* matmul_blocks.c: activations quantized for the types (8-bit, per block of 32 for the 32-weight types and per 256
 * for the k-quants, as llama.cpp's Q8_0 and Q8_K), then the team's matmul over a BlockMatrix */
int64_t blocks_prepared_bytes(int64_t M, int64_t K);
void blocks_matmul_team(const float *x, const BlockMatrix *matrix, const float *bias, float *y, int64_t M, int64_t N,
                        int64_t K, void *prepared, int part, int parts);

#endif
