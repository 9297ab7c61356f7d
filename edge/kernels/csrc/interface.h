/* The CPU kernel's interface, declared once: every struct, enum and constant that crosses between the C library and
 * Python, and the functions the library exports. edge/kernels/cpu_kernel.py reads this file with cffi's cdef (ABI
 * mode), so nothing below is restated in Python; tests/kernels/test_interface_layout.py compiles a program that
 * prints the compiler's sizeof and offsetof of every struct here and holds cffi's layout to it.
 *
 * Kept to what cffi's cdef reads: typedef'd structs and enums, prototypes, comments. The include guard, #include
 * lines and _Static_assert lines (one line each) are dropped before cdef reads the text (cpu_kernel.declarations).
 * Each field's comment gives its shape, as llama2.c's structs do.
 */
#ifndef EDGE_INTERFACE_H
#define EDGE_INTERFACE_H

#include <stdint.h>

/* ---- limits (enums rather than #defines, so that Python reads them as it reads the formats) ---- */

typedef enum {
    TREE_ROWS = 64,             /* the most rows a token tree's verify pass may hold (attention.c's path buffer) */
    MAX_HEAD_DIM = 512          /* the widest head the fused calls take (rope_rows' and hierarchical_store's buffers) */
} KernelLimit;

typedef enum {
    BLOCKS_GROUP = 16,          /* outputs side by side in a block format's packed group */
    BLOCKS_MAX_SEGMENTS = 4,    /* row segments of one BlockMatrix */
    QK = 32,                    /* weights per block of the 32-weight block types (ggml's QK4_0 .. QK8_0) */
    QK_K = 256                  /* weights per block of the k-quants (ggml's QK_K) */
} BlockLimit;

typedef enum {
    INT8_GROUP = 16,            /* WEIGHTS_INT8: outputs packed side by side (edge/kernels/cpu_packing.py) */
    INT8_CHUNK = 4              /* WEIGHTS_INT8: inputs per chunk, what one dot instruction takes per output */
} Int8Layout;

/* ---- weight formats: how a matrix or norm is stored (biases are float32) ----
 * WEIGHTS_INT8: matrices packed by edge/kernels/cpu_packing.py (matmul_int8.c), norms float32. WEIGHTS_BLOCKS: a
 * matrix is a BlockMatrix of llama.cpp's block formats (blocks.h, matmul_blocks.c: a GGUF file's, or edge's int4),
 * norms float32. */
typedef enum {
    WEIGHTS_FLOAT32 = 0,
    WEIGHTS_BFLOAT16 = 1,
    WEIGHTS_FLOAT16 = 2,
    WEIGHTS_INT8 = 3,
    WEIGHTS_BLOCKS = 5
} WeightFormat;

/* ---- block types: ggml's own type numbers (GGUF's tensor_type) ----
 * F32, F16 and BF16 segments (a matrix a quantized file keeps in floats) keep the file's row-major layout and run on
 * the float kernel (matmul_float.c). */
typedef enum {
    BLOCKS_F32 = 0,
    BLOCKS_F16 = 1,
    BLOCKS_Q4_0 = 2,
    BLOCKS_Q4_1 = 3,
    BLOCKS_Q5_0 = 6,
    BLOCKS_Q5_1 = 7,
    BLOCKS_Q8_0 = 8,
    BLOCKS_Q4_K = 12,
    BLOCKS_Q5_K = 13,
    BLOCKS_Q6_K = 14,
    BLOCKS_BF16 = 30
} BlockType;

/* ---- one decoder layer's weights: the slots of its row in a ModelView's table ----
 * Norms and matrices in the view's format, biases float32, NULL where the layer has none (q_norm and k_norm: Qwen3's
 * and Gemma 3's per-head norms; the biases: Qwen2's q/k/v bias; post_attn_norm and post_ffn_norm: Gemma 3's norms of
 * the attention's and the feed-forward's outputs before each residual add). The slot names say the kind: *_norm a
 * norm, *_bias a bias, the rest matrices. */
typedef enum {
    SLOT_ATTN_NORM,     /* (D) */
    SLOT_WQKV,          /* (H*Dh + 2*Hkv*Dh, D): q, k, v stacked */
    SLOT_QKV_BIAS,      /* (H*Dh + 2*Hkv*Dh) */
    SLOT_Q_NORM,        /* (Dh) */
    SLOT_K_NORM,        /* (Dh) */
    SLOT_WO,            /* (D, H*Dh) */
    SLOT_O_BIAS,        /* (D) */
    SLOT_POST_ATTN_NORM,  /* (D) */
    SLOT_FFN_NORM,      /* (D) */
    SLOT_W_GATE_UP,     /* (2I, D): gate, up stacked */
    SLOT_GATE_UP_BIAS,  /* (2I) */
    SLOT_W_DOWN,        /* (D, I) */
    SLOT_DOWN_BIAS,     /* (D) */
    SLOT_POST_FFN_NORM, /* (D) */
    SLOT_COUNT
} LayerSlot;

/* ---- the feed-forward gate's activation: act(gate) * up ---- */
typedef enum {
    ACTIVATION_SILU = 0,        /* SwiGLU */
    ACTIVATION_GELU_TANH = 1    /* GeGLU with gelu's tanh approximation (Gemma; transformers' gelu_pytorch_tanh) */
} Activation;

typedef struct {
    const void *slots[SLOT_COUNT];  /* indexed by LayerSlot */
} LayerWeights;

/* ---- the model a fused call runs ----
 * What a pass through the model's layers needs beside the rows and the cache: dimensions, the layers' weights and
 * what each layer computes, and for a whole step or a draft the embedding, final norm and head with their formats.
 * Every fused entry point takes it; the tensors behind the pointers must outlive every call given it.
 *
 * Rotary tables (the entry points' cos/sin, DraftArgs' cos_table/sin_table) hold rope_stride floats per position:
 * one table's R values, or two side by side (Gemma 3: the global layers' R, then the local layers' R, each with its
 * own base). Layer l reads the R values at rope_offsets[l] of its position's row, and rotates the leading R dims of
 * each head (R < Dh: Phi-4-mini's partial rotary); LongRoPE's factor is already in the tables. */
typedef struct {
    int64_t D, H, Hkv, Dh, I;      /* hidden size, query heads, KV heads, head size, FFN size */
    int64_t V;                     /* the head's rows */
    int64_t R, rope_stride;        /* rotary dims of a head (even, <= Dh); floats per position in the rotary tables */
    float eps, scale;              /* RMSNorm's epsilon; the scores' scale (Dh^-0.5; Gemma 3 its own) */
    float embed_scale;             /* an embedding row is multiplied by it (Gemma: sqrt(D)); 0: not scaled */
    float softcap;                 /* logits = softcap * tanh(logits / softcap) (final_logit_softcapping); 0: none */
    int32_t activation;            /* Activation of the layers' feed-forward gate */
    int32_t format;                /* WeightFormat of the layers' matrices, norms alike */
    int32_t embed_format, norm_format, head_format;  /* WeightFormat of each */
    const LayerWeights *layers;    /* (L) */
    const int64_t *windows;        /* (L) each layer's sliding window (0: none) */
    const int64_t *rope_offsets;   /* (L) where each layer's R values start in a position's rotary row */
    const void *embed;             /* (V, D), or a BlockMatrix */
    const void *norm;              /* (D) */
    const void *head;              /* (V, D), packed int8 bytes, or a BlockMatrix */
} ModelView;

/* ---- residual streams a pass keeps (EAGLE-3's target features) ----
 * After layer layers[c] of a pass has run, row t's residual stream (D floats) is copied to
 * rows + t * row_stride + c * D: the c-th of `count` captures sits beside the others in the row. */
typedef struct {
    const int64_t *layers;         /* (count) the layers after which to copy; a layer may appear more than once */
    int64_t count;
    float *rows;                   /* row t at rows + t * row_stride */
    int64_t row_stride;            /* floats from one row to the next (>= count * D) */
} Capture;

/* ---- rows of several sequences in one pass (continuous batching) ----
 * Each sequence owns a contiguous region of the cache; its rows continue it. Row t writes its keys/values to slot
 * slots[t] and attends to slots [firsts[t], slots[t]] (its own sequence's, up to itself); its rotary rows are those of
 * its position in its sequence (slots[t] - firsts[t]). The pass's `start` is then span - T, span being 1 + the
 * largest slot, so that the scratch the *_scratch functions size for start + T positions covers every row's. */
typedef struct {
    const int64_t *slots;          /* (T) */
    const int64_t *firsts;         /* (T) */
} RowSlots;

/* ---- one greedy draft ----
 * What a draft asks beside the model (its ModelView) and the cache: the first step's rows, the layers to run, the
 * rotary tables, how many tokens to draft and when to stop, and where the drafted tokens go. */
typedef struct {
    const int64_t *tokens;         /* (T0) the first step's tokens, at positions [start, start + T0) */
    const float *features;         /* (T0, D) their features (a feature drafter), or NULL */
    const void *fc;                /* (D, 2D) a feature drafter's fusion, in the layers' format, or NULL */
    const int64_t *order;          /* (count) the layers run */
    const float *cos_table;        /* (S, rope_stride) whole rotary tables (ModelView): row p is position p */
    const float *sin_table;        /* (S, rope_stride) */
    const int64_t *head_ids;       /* (V) the token of each head row (a trimmed head), or NULL: row v is token v */
    int64_t T0, count, start, k;
    float stop_below;              /* > 0: stop before a token (never the first) whose probability is below it */
    int64_t *out;                  /* (k) the drafted tokens */
    int64_t *runners_up;           /* (k) each step's second most likely token, or NULL */
    float *probabilities;          /* (k, 2) the draft token's and the runner-up's probabilities, with runners_up */
} DraftArgs;

/* ---- QuantSpec's hierarchical KV cache (kv_hierarchical.c; edge/kernels/kv_quant.py is the specification) ---- */
typedef struct {
    uint8_t *upper;                /* (L, Hkv, S_max, Dh/2) the codes' upper nibbles, two values a byte */
    uint8_t *lower;                /* (L, Hkv, S_max, Dh/2) their lower nibbles */
    uint16_t *step;                /* (L, Hkv, S_max) float16 bits */
    uint16_t *low;                 /* (L, Hkv, S_max) float16 bits */
} HierarchicalPlanes;

typedef struct {
    HierarchicalPlanes keys, values;
    int32_t draft;                 /* read the upper planes alone (the draft's 4-bit view) */
    const float *key_scales;       /* (L, Hkv, Dh) powers of two: keys are stored divided by them; or NULL */
} HierarchicalCache;

/* ---- a matrix in block formats (blocks.h) ----
 * Up to BLOCKS_MAX_SEGMENTS row segments, each in its own BlockType (a fused q/k/v projection whose v is Q6_K beside
 * Q4_K q and k), stacked: segment s's outputs follow segment s - 1's. */
typedef struct {
    int32_t count;
    int32_t formats[BLOCKS_MAX_SEGMENTS];    /* BlockType */
    int64_t rows[BLOCKS_MAX_SEGMENTS];
    const uint8_t *data[BLOCKS_MAX_SEGMENTS];  /* packed groups (blocks_repack), or a float segment's rows */
} BlockMatrix;

/* ---- one output's block as a GGUF file holds it (ggml's block_* structs; float16 values as their bits) ---- */
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_k;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_k;

/* ---- one block of a group of BLOCKS_GROUP outputs as the kernel holds it (blocks.h says how) ----
 * A chunk, pair or plane is 4 * BLOCKS_GROUP = 64 bytes: output n at bytes 4n .. 4n + 3. Per-output numbers
 * (float16 bits, k-quant scales) are BLOCKS_GROUP side by side, output n at n. */
typedef struct {
    int8_t chunks[8][4 * BLOCKS_GROUP];      /* chunk c: weights 4c .. 4c + 3 */
    uint16_t d[BLOCKS_GROUP];
} group_q8_0;
typedef struct {
    uint8_t pairs[4][4 * BLOCKS_GROUP];      /* pair p: chunk 2p's codes in the low nibbles, 2p + 1's in the high */
    uint16_t d[BLOCKS_GROUP];
} group_q4_0;
typedef struct {
    uint8_t pairs[4][4 * BLOCKS_GROUP];
    uint16_t d[BLOCKS_GROUP], m[BLOCKS_GROUP];
} group_q4_1;
typedef struct {
    uint8_t pairs[4][4 * BLOCKS_GROUP];
    uint8_t plane[4 * BLOCKS_GROUP];         /* bit c of byte 4n + i: bit 4 of chunk c's value (n, i) */
    uint16_t d[BLOCKS_GROUP];
} group_q5_0;
typedef struct {
    uint8_t pairs[4][4 * BLOCKS_GROUP];
    uint8_t plane[4 * BLOCKS_GROUP];
    uint16_t d[BLOCKS_GROUP], m[BLOCKS_GROUP];
} group_q5_1;
typedef struct {
    uint8_t pairs[8][4][4 * BLOCKS_GROUP];   /* 8 runs of 32 weights, 4 pairs each */
    uint8_t scales[8][BLOCKS_GROUP];         /* run j's scale, output n at n */
    uint8_t mins[4][2 * BLOCKS_GROUP];       /* runs 2i and 2i + 1's mins, output n at 2n, 2n + 1 */
    uint16_t d[BLOCKS_GROUP], dmin[BLOCKS_GROUP];
} group_q4_k;
typedef struct {
    uint8_t pairs[8][4][4 * BLOCKS_GROUP];
    uint8_t planes[8][4 * BLOCKS_GROUP];     /* run j's plane, as group_q5_0's */
    uint8_t scales[8][BLOCKS_GROUP];
    uint8_t mins[4][2 * BLOCKS_GROUP];
    uint16_t d[BLOCKS_GROUP], dmin[BLOCKS_GROUP];
} group_q5_k;
typedef struct {
    uint8_t pairs[2][4 * BLOCKS_GROUP];
    uint8_t plane[4 * BLOCKS_GROUP];         /* bits 2c, 2c + 1 of byte 4n + i: bits 4, 5 of chunk c's value (n, i) */
} run_q6_k;
typedef struct {
    run_q6_k runs[16];                       /* 16 runs of 16 weights */
    int8_t scales[16][BLOCKS_GROUP];         /* run j's scale, output n at n */
    uint16_t d[BLOCKS_GROUP];
} group_q6_k;

/* the sizes blocks.h's table gives (and the file's, ggml's) */
_Static_assert(sizeof(block_q8_0) == 34 && sizeof(group_q8_0) == 544, "Q8_0");
_Static_assert(sizeof(block_q4_0) == 18 && sizeof(group_q4_0) == 288, "Q4_0");
_Static_assert(sizeof(block_q4_1) == 20 && sizeof(group_q4_1) == 320, "Q4_1");
_Static_assert(sizeof(block_q5_0) == 22 && sizeof(group_q5_0) == 352, "Q5_0");
_Static_assert(sizeof(block_q5_1) == 24 && sizeof(group_q5_1) == 384, "Q5_1");
_Static_assert(sizeof(block_q4_k) == 144 && sizeof(group_q4_k) == 2368, "Q4_K");
_Static_assert(sizeof(block_q5_k) == 176 && sizeof(group_q5_k) == 2880, "Q5_K");
_Static_assert(sizeof(block_q6_k) == 210 && sizeof(group_q6_k) == 3360, "Q6_K");
_Static_assert(sizeof(LayerWeights) == SLOT_COUNT * sizeof(void *), "LayerWeights is a plain row of pointers");

/* ---- the exported functions ---- */

const char *kernel_path(void);  /* "avx2", "avx512-vnni", "neon-dotprod", "portable", ... */

/* x (M, K) float32 through w (N, K) in `format` (a WeightFormat; WEIGHTS_BLOCKS: w is a BlockMatrix) + bias (N) ->
 * y (M, N), each row computed as in a 1-row call (matmul.c) */
void rowwise_matmul(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                    int format, int threads);
void rowwise_attention_f32(const float *q, const float *keys, const float *values, float *out, float *scratch,
                           int64_t H, int64_t Hkv, int64_t T, int64_t D, int64_t kv_head_stride, int64_t start,
                           int64_t window, float scale, int threads);
void attention_share(const float *q, const float *keys, const float *values, float *out, float *scratch, int64_t H,
                     int64_t Hkv, int64_t T, int64_t D, int64_t kv_head_stride, int64_t start, int64_t window,
                     float scale, const int64_t *parents, const RowSlots *rows, int part, int parts);
void rms_norm_f32(const float *x, const void *w, float *out, int64_t T, int64_t D, float eps, int format);

/* layers.c: the fused passes, and the scratch floats each one carves */
void fused_layers_f32(const ModelView *m, float *x, int64_t T, int64_t start, const int64_t *order, int64_t count,
                      const float *cos_table, const float *sin_table, float *keys, float *values,
                      const HierarchicalCache *hier, int64_t S_max, int64_t layer_stride, const Capture *capture,
                      float *scratch, int threads);
void forward_step_f32(const ModelView *m, const int64_t *tokens, int64_t T, int64_t start, const int64_t *order,
                      int64_t count, const float *cos_table, const float *sin_table, float *keys, float *values,
                      const HierarchicalCache *hier, int64_t S_max, int64_t layer_stride, const int64_t *parents,
                      const RowSlots *rows, const Capture *capture, float *hidden, float *logits, float *scratch,
                      int threads);
int64_t draft_greedy_f32(const ModelView *m, const DraftArgs *a, float *keys, float *values,
                         const HierarchicalCache *hier, int64_t S_max, int64_t layer_stride, float *scratch,
                         int threads);
int64_t fused_layers_scratch(const ModelView *m, int64_t T, int64_t start, int hierarchical);
int64_t forward_step_scratch(const ModelView *m, int64_t T, int64_t start, int hierarchical);
int64_t draft_greedy_scratch(const ModelView *m, int64_t T0, int64_t start, int64_t k, int hierarchical);

/* kv_hierarchical.c */
void hierarchical_store(const HierarchicalCache *cache, int64_t layer, const float *keys, const float *values,
                        int64_t row_stride, int64_t T, int64_t start, int64_t Hkv, int64_t Dh, int64_t S_max);
void hierarchical_load_share(const HierarchicalCache *cache, int64_t layer, float *keys_out, float *values_out,
                             int64_t span, int64_t Hkv, int64_t Dh, int64_t S_max, int part, int parts);

/* blocks_layout.c, blocks_quantize.c: `format` a BlockType */
int64_t blocks_packed_bytes(int format, int64_t N, int64_t K);
void blocks_repack(int format, const uint8_t *file, int64_t N, int64_t K, uint8_t *packed, int threads);
void blocks_dequantize_rows(int format, const uint8_t *packed, int64_t K, int64_t first, int64_t count, float *out);
void blocks_quantize(int format, const float *x, int64_t N, int64_t K, uint8_t *file, int threads);

/* matmul_float.c: the machine's read bandwidth as this path sees it */
double read_bandwidth_probe(const float *data, int64_t count, int threads, int streams);

#endif
