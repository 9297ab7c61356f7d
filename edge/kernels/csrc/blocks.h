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

#include <stddef.h>
#include <stdint.h>

#include "interface.h"

/* The structs of the table above live in interface.h (group_q4_k: one group's block of Q4_K; block_q4_k: one
 * output's block in the file), with their sizes checked there; the code below and matmul_blocks.c address their
 * fields, never raw offsets. */

static inline int blocks_k_quant(int format) { return format >= BLOCKS_Q4_K && format <= BLOCKS_Q6_K; }
static inline int blocks_float(int format) {
    return format == BLOCKS_F32 || format == BLOCKS_F16 || format == BLOCKS_BF16;
}

/* B: weights per block (1 for the float formats) */
static inline int64_t block_weights(int format) {
    return blocks_k_quant(format) ? QK_K : blocks_float(format) ? 1 : QK;
}

/* one output's block in the file (a float format: one value; 0: not a block format edge runs) */
static inline int64_t block_file_bytes(int format) {
    switch (format) {
        case BLOCKS_Q8_0: return sizeof(block_q8_0);
        case BLOCKS_Q4_0: return sizeof(block_q4_0);
        case BLOCKS_Q4_1: return sizeof(block_q4_1);
        case BLOCKS_Q5_0: return sizeof(block_q5_0);
        case BLOCKS_Q5_1: return sizeof(block_q5_1);
        case BLOCKS_Q4_K: return sizeof(block_q4_k);
        case BLOCKS_Q5_K: return sizeof(block_q5_k);
        case BLOCKS_Q6_K: return sizeof(block_q6_k);
        case BLOCKS_F32: return sizeof(float);
        case BLOCKS_F16: case BLOCKS_BF16: return sizeof(uint16_t);
        default: return 0;
    }
}

/* one group's block here (the float formats are not grouped: blocks_packed_bytes) */
static inline int64_t block_group_bytes(int format) {
    switch (format) {
        case BLOCKS_Q8_0: return sizeof(group_q8_0);
        case BLOCKS_Q4_0: return sizeof(group_q4_0);
        case BLOCKS_Q4_1: return sizeof(group_q4_1);
        case BLOCKS_Q5_0: return sizeof(group_q5_0);
        case BLOCKS_Q5_1: return sizeof(group_q5_1);
        case BLOCKS_Q4_K: return sizeof(group_q4_k);
        case BLOCKS_Q5_K: return sizeof(group_q5_k);
        case BLOCKS_Q6_K: return sizeof(group_q6_k);
        default: return 0;
    }
}

/* A 32-weight type's group as its fields: the codes (4 pairs; Q8_0: 8 chunks), the plane (5-bit types), the scales
 * d and mins m (Q4_1, Q5_1); NULL where the type has none. One place says where each field is, for the layout code
 * (blocks_layout.c, which writes them: the pointers are not const) and the matmul (matmul_blocks.c) alike. */
typedef struct {
    uint8_t *codes, *plane;
    uint16_t *d, *m;
} Fields32;

static inline __attribute__((always_inline)) Fields32 fields_32(int format, const void *block) {
    void *group = (void *)block;
    Fields32 f = {NULL, NULL, NULL, NULL};
    switch (format) {
        case BLOCKS_Q8_0: {
            group_q8_0 *g = group;
            f.codes = (uint8_t *)g->chunks, f.d = g->d;
            break;
        }
        case BLOCKS_Q4_0: {
            group_q4_0 *g = group;
            f.codes = g->pairs[0], f.d = g->d;
            break;
        }
        case BLOCKS_Q4_1: {
            group_q4_1 *g = group;
            f.codes = g->pairs[0], f.d = g->d, f.m = g->m;
            break;
        }
        case BLOCKS_Q5_0: {
            group_q5_0 *g = group;
            f.codes = g->pairs[0], f.plane = g->plane, f.d = g->d;
            break;
        }
        default: {  /* BLOCKS_Q5_1 */
            group_q5_1 *g = group;
            f.codes = g->pairs[0], f.plane = g->plane, f.d = g->d, f.m = g->m;
            break;
        }
    }
    return f;
}

/* A k-quant's group as its fields: run j's pairs and plane (Q5_K, Q6_K), scales (run j's BLOCKS_GROUP bytes), mins
 * in pairs of runs (Q4_K, Q5_K), d and dmin. */
typedef struct {
    uint8_t *scales, *mins;
    uint16_t *d, *dmin;
} FieldsK;

static inline __attribute__((always_inline)) FieldsK fields_k(int format, const void *block) {
    void *group = (void *)block;
    FieldsK f = {NULL, NULL, NULL, NULL};
    switch (format) {
        case BLOCKS_Q4_K: {
            group_q4_k *g = group;
            f.scales = g->scales[0], f.mins = g->mins[0], f.d = g->d, f.dmin = g->dmin;
            break;
        }
        case BLOCKS_Q5_K: {
            group_q5_k *g = group;
            f.scales = g->scales[0], f.mins = g->mins[0], f.d = g->d, f.dmin = g->dmin;
            break;
        }
        default: {  /* BLOCKS_Q6_K */
            group_q6_k *g = group;
            f.scales = (uint8_t *)g->scales, f.d = g->d;
            break;
        }
    }
    return f;
}

/* run j's pairs and plane (NULL for Q4_K) in a k-quant's group */
static inline __attribute__((always_inline)) uint8_t *run_pairs(int format, const void *group, int j) {
    if (format == BLOCKS_Q4_K) return ((group_q4_k *)group)->pairs[j][0];
    if (format == BLOCKS_Q5_K) return ((group_q5_k *)group)->pairs[j][0];
    return ((group_q6_k *)group)->runs[j].pairs[0];
}
static inline __attribute__((always_inline)) uint8_t *run_plane(int format, const void *group, int j) {
    if (format == BLOCKS_Q4_K) return NULL;
    if (format == BLOCKS_Q5_K) return ((group_q5_k *)group)->planes[j];
    return ((group_q6_k *)group)->runs[j].plane;
}

/* blocks_layout.c: one row of a BlockMatrix as float32 (an embedding's lookup) */
void block_matrix_row(const BlockMatrix *matrix, int64_t K, int64_t row, float *out);

/* matmul_blocks.c: activations quantized for the types (8-bit, per block of 32 for the 32-weight types and per 256
 * for the k-quants, as llama.cpp's Q8_0 and Q8_K), then the team's matmul over a BlockMatrix */
int64_t blocks_prepared_bytes(int64_t M, int64_t K);
void blocks_matmul_team(const float *x, const BlockMatrix *matrix, const float *bias, float *y, int64_t M, int64_t N,
                        int64_t K, void *prepared, int part, int parts);

#endif
