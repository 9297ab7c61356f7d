/* The block formats' layout (blocks.h): a GGUF tensor's bytes rearranged into groups of 16 outputs, and rows read
 * back as float32 (an embedding's lookups; the tests hold them to the gguf package's dequantization).
 *
 * Both directions go through one output's block unpacked: its codes as stored (unsigned, int8 for Q8_0), float16
 * scale bits, and the k-quants' sub-block scales and mins. Repacking moves bits and never computes a value, so a
 * packed matrix holds exactly the file's numbers.
 */
#include <omp.h>
#include <string.h>

#include "blocks.h"
#include "simd.h"

/* One output's block, unpacked */
typedef struct {
    uint8_t q[256];             /* codes as stored: 4, 5 or 6 bits unsigned; Q8_0's int8 bytes */
    uint16_t d, m;              /* float16 bits: the scale d, and the min m (Q4_1, Q5_1) or dmin (k-quants) */
    uint8_t scales[16], mins[8];  /* k-quants: sub-block scales (Q6_K: int8 bytes) and mins (Q4_K, Q5_K) */
} Unpacked;

/* Rows of K weights take whole blocks: K / B rounded up (the padding holds zero weights) */
static int64_t row_blocks(int format, int64_t K) { return (K + block_weights(format) - 1) / block_weights(format); }

int64_t blocks_packed_bytes(int format, int64_t N, int64_t K) {
    if (blocks_float(format)) return N * K * block_file_bytes(format);
    return (N + BLOCKS_GROUP - 1) / BLOCKS_GROUP * row_blocks(format, K) * block_group_bytes(format);
}

/* the k-quants' 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4) */
static void unpack_scale_mins(const uint8_t *s, uint8_t *scales, uint8_t *mins) {
    for (int j = 0; j < 4; j++) {
        scales[j] = s[j] & 63;
        mins[j] = s[j + 4] & 63;
        scales[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 6) << 4);
        mins[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
}

/* the 32 codes of a Q4_0/Q4_1 block's 16 bytes: element j low nibbles, j + 16 high */
static void unpack_nibbles32(const uint8_t *qs, uint8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
    }
}

/* One output's block of the file (ggml's block_* structs, interface.h) unpacked */
static void unpack_file_block(int format, const void *file_block, Unpacked *u) {
    switch (format) {
        case BLOCKS_Q8_0: {
            const block_q8_0 *b = file_block;
            u->d = b->d;
            memcpy(u->q, b->qs, QK);
            break;
        }
        case BLOCKS_Q4_0: {
            const block_q4_0 *b = file_block;
            u->d = b->d;
            unpack_nibbles32(b->qs, u->q);
            break;
        }
        case BLOCKS_Q4_1: {
            const block_q4_1 *b = file_block;
            u->d = b->d, u->m = b->m;
            unpack_nibbles32(b->qs, u->q);
            break;
        }
        case BLOCKS_Q5_0:
        case BLOCKS_Q5_1: {
            const block_q5_0 *b0 = file_block;
            const block_q5_1 *b1 = file_block;
            const int minned = format == BLOCKS_Q5_1;
            u->d = minned ? b1->d : b0->d;
            if (minned) u->m = b1->m;
            uint32_t high;
            memcpy(&high, minned ? b1->qh : b0->qh, 4);
            unpack_nibbles32(minned ? b1->qs : b0->qs, u->q);
            for (int j = 0; j < 32; j++) u->q[j] |= ((high >> j) & 1) << 4;
            break;
        }
        case BLOCKS_Q4_K:
        case BLOCKS_Q5_K: {
            const block_q4_k *b4 = file_block;
            const block_q5_k *b5 = file_block;
            const int five = format == BLOCKS_Q5_K;
            u->d = five ? b5->d : b4->d, u->m = five ? b5->dmin : b4->dmin;
            unpack_scale_mins(five ? b5->scales : b4->scales, u->scales, u->mins);
            const uint8_t *qh = b5->qh, *qs = five ? b5->qs : b4->qs;
            for (int c = 0; c < 4; c++)  /* 64 weights per 32 bytes: sub-block 2c low nibbles, 2c + 1 high */
                for (int l = 0; l < 32; l++) {
                    u->q[64 * c + l] = qs[32 * c + l] & 0x0F;
                    u->q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
                    if (five) {
                        u->q[64 * c + l] |= ((qh[l] >> (2 * c)) & 1) << 4;
                        u->q[64 * c + 32 + l] |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                }
            break;
        }
        default: { /* BLOCKS_Q6_K */
            const block_q6_k *b = file_block;
            const uint8_t *ql = b->ql, *qh = b->qh;
            memcpy(u->scales, b->scales, 16);
            u->d = b->d;
            for (int half = 0; half < 2; half++)
                for (int l = 0; l < 32; l++) {
                    const int e = 128 * half + l;
                    const uint8_t h = qh[32 * half + l], a = ql[64 * half + l], c = ql[64 * half + 32 + l];
                    u->q[e] = (a & 0x0F) | ((h & 3) << 4);
                    u->q[e + 32] = (c & 0x0F) | (((h >> 2) & 3) << 4);
                    u->q[e + 64] = (a >> 4) | (((h >> 4) & 3) << 4);
                    u->q[e + 96] = (c >> 4) | (((h >> 6) & 3) << 4);
                }
            break;
        }
    }
}

/* Output n's share of a run of `length` (32 or 16) codes q into a group's pairs (and plane: bits 5-bit, 6-bit, or
 * none) */
static void place_run(const uint8_t *q, int length, int n, uint8_t *pairs, uint8_t *plane, int plane_bits) {
    for (int p = 0; p < length / 8; p++)
        for (int i = 0; i < 4; i++)
            pairs[64 * p + 4 * n + i] = (q[8 * p + i] & 0x0F) | (q[8 * p + 4 + i] & 0x0F) << 4;
    if (plane_bits == 0) return;
    for (int i = 0; i < 4; i++) {
        uint8_t bits = 0;
        for (int c = 0; c < length / 4; c++) bits |= ((q[4 * c + i] >> 4) & ((1 << plane_bits) - 1)) << (plane_bits * c);
        plane[4 * n + i] = bits;
    }
}

static void read_run(const uint8_t *pairs, const uint8_t *plane, int plane_bits, int length, int n, uint8_t *q) {
    for (int p = 0; p < length / 8; p++)
        for (int i = 0; i < 4; i++) {
            const uint8_t byte = pairs[64 * p + 4 * n + i];
            q[8 * p + i] = byte & 0x0F;
            q[8 * p + 4 + i] = byte >> 4;
        }
    if (plane_bits == 0) return;
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < length / 4; c++)
            q[4 * c + i] |= ((plane[4 * n + i] >> (plane_bits * c)) & ((1 << plane_bits) - 1)) << 4;
}

/* Output n of a group's block g (blocks.h's field accessors) from the unpacked form */
static void place_block(int format, const Unpacked *u, int n, void *g) {
    if (!blocks_k_quant(format)) {
        const Fields32 f = fields_32(format, g);
        if (format == BLOCKS_Q8_0)
            for (int c = 0; c < 8; c++) memcpy(f.codes + 64 * c + 4 * n, u->q + 4 * c, 4);
        else
            place_run(u->q, 32, n, f.codes, f.plane, f.plane != NULL);
        f.d[n] = u->d;
        if (f.m) f.m[n] = u->m;
        return;
    }
    const FieldsK f = fields_k(format, g);
    const int six = format == BLOCKS_Q6_K, runs = six ? 16 : 8, length = six ? 16 : 32;
    const int plane_bits = six ? 2 : format == BLOCKS_Q5_K;
    for (int j = 0; j < runs; j++) {
        place_run(u->q + length * j, length, n, run_pairs(format, g, j), run_plane(format, g, j), plane_bits);
        f.scales[BLOCKS_GROUP * j + n] = u->scales[j];
        if (f.mins) f.mins[2 * BLOCKS_GROUP * (j / 2) + 2 * n + j % 2] = u->mins[j];  /* pairs of sub-blocks */
    }
    f.d[n] = u->d;
    if (f.dmin) f.dmin[n] = u->m;
}

/* Output n of a group's block g into the unpacked form */
static void read_block(int format, const void *g, int n, Unpacked *u) {
    if (!blocks_k_quant(format)) {
        const Fields32 f = fields_32(format, g);
        if (format == BLOCKS_Q8_0)
            for (int c = 0; c < 8; c++) memcpy(u->q + 4 * c, f.codes + 64 * c + 4 * n, 4);
        else
            read_run(f.codes, f.plane, f.plane != NULL, 32, n, u->q);
        u->d = f.d[n];
        if (f.m) u->m = f.m[n];
        return;
    }
    const FieldsK f = fields_k(format, g);
    const int six = format == BLOCKS_Q6_K, runs = six ? 16 : 8, length = six ? 16 : 32;
    const int plane_bits = six ? 2 : format == BLOCKS_Q5_K;
    for (int j = 0; j < runs; j++) {
        read_run(run_pairs(format, g, j), run_plane(format, g, j), plane_bits, length, n, u->q + length * j);
        u->scales[j] = f.scales[BLOCKS_GROUP * j + n];
        if (f.mins) u->mins[j] = f.mins[2 * BLOCKS_GROUP * (j / 2) + 2 * n + j % 2];
    }
    u->d = f.d[n];
    if (f.dmin) u->m = f.dmin[n];
}

/* The values a block stands for, in the gguf package's order of float32 operations (ggml's dequantize_row_*) */
static void block_values(int format, const Unpacked *u, float *out) {
    const float d = f16_to_f32(u->d), m = f16_to_f32(u->m);
    switch (format) {
        case BLOCKS_Q8_0:
            for (int j = 0; j < 32; j++) out[j] = d * (float)(int8_t)u->q[j];
            break;
        case BLOCKS_Q4_0:
            for (int j = 0; j < 32; j++) out[j] = d * (float)((int)u->q[j] - 8);
            break;
        case BLOCKS_Q5_0:
            for (int j = 0; j < 32; j++) out[j] = d * (float)((int)u->q[j] - 16);
            break;
        case BLOCKS_Q4_1:
        case BLOCKS_Q5_1:
            for (int j = 0; j < 32; j++) out[j] = d * (float)u->q[j] + m;
            break;
        case BLOCKS_Q4_K:
        case BLOCKS_Q5_K:
            for (int j = 0; j < 8; j++) {
                const float scale = d * (float)u->scales[j], min = m * (float)u->mins[j];
                for (int l = 0; l < 32; l++) out[32 * j + l] = scale * (float)u->q[32 * j + l] - min;
            }
            break;
        default:
            for (int j = 0; j < 16; j++) {
                const float scale = d * (float)(int8_t)u->scales[j];
                for (int l = 0; l < 16; l++) out[16 * j + l] = scale * (float)((int)u->q[16 * j + l] - 32);
            }
            break;
    }
}

/* file (N rows of K / B file blocks each, rounded up) -> packed (blocks_packed_bytes), padding rows zero */
void blocks_repack(int format, const uint8_t *file, int64_t N, int64_t K, uint8_t *packed, int threads) {
    if (blocks_float(format)) {  /* kept as the file lays it out */
        memcpy(packed, file, (size_t)blocks_packed_bytes(format, N, K));
        return;
    }
    const int64_t blocks = row_blocks(format, K), file_row = blocks * block_file_bytes(format);
    const int64_t group_bytes = block_group_bytes(format), groups = (N + BLOCKS_GROUP - 1) / BLOCKS_GROUP;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < groups; g++) {
        uint8_t *out = packed + g * blocks * group_bytes;
        memset(out, 0, blocks * group_bytes);
        Unpacked u;
        for (int n = 0; n < BLOCKS_GROUP && g * BLOCKS_GROUP + n < N; n++)
            for (int64_t b = 0; b < blocks; b++) {
                memset(&u, 0, sizeof u);
                unpack_file_block(format, file + (g * BLOCKS_GROUP + n) * file_row + b * block_file_bytes(format), &u);
                place_block(format, &u, n, out + b * group_bytes);
            }
    }
}

/* rows [first, first + count) of a packed matrix as float32 (count, K) */
void blocks_dequantize_rows(int format, const uint8_t *packed, int64_t K, int64_t first, int64_t count, float *out) {
    if (blocks_float(format)) {
        const int kind = format == BLOCKS_F32 ? WEIGHTS_FLOAT32 : format == BLOCKS_F16 ? WEIGHTS_FLOAT16 : WEIGHTS_BFLOAT16;
        for (int64_t i = 0; i < count * K; i++) out[i] = weight_at(packed, first * K + i, kind);
        return;
    }
    const int64_t B = block_weights(format), blocks = row_blocks(format, K), group_bytes = block_group_bytes(format);
    Unpacked u;
    float values[256];
    for (int64_t r = 0; r < count; r++) {
        const int64_t row = first + r;
        const uint8_t *group = packed + row / BLOCKS_GROUP * blocks * group_bytes;
        for (int64_t b = 0; b < blocks; b++) {
            memset(&u, 0, sizeof u);
            read_block(format, group + b * group_bytes, (int)(row % BLOCKS_GROUP), &u);
            block_values(format, &u, values);
            memcpy(out + r * K + b * B, values, (size_t)(K - b * B < B ? K - b * B : B) * sizeof(float));
        }
    }
}

/* one row of a BlockMatrix (the segment that holds it) as float32 (K): an embedding's lookup */
void block_matrix_row(const BlockMatrix *matrix, int64_t K, int64_t row, float *out) {
    for (int s = 0; s < matrix->count; row -= matrix->rows[s], s++)
        if (row < matrix->rows[s]) {
            blocks_dequantize_rows(matrix->formats[s], matrix->data[s], K, row, 1, out);
            return;
        }
}
