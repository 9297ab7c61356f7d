/* The fused decoder layers and the one-call greedy drafter: a decode step or a verify pass through the model (or a
 * self-draft's layer subset) without a Python round trip between layers, from the matmuls and attention of the
 * other csrc files. Each row's operations are those of a 1-row call, so a row's result still does not depend on
 * how many rows share the call.
 */
#include <omp.h>
#include <stdlib.h>

#include "blocks.h"
#include "simd.h"

/* out (D) = embedding row `token` in `format` (a BlockMatrix of llama.cpp's blocks is dequantized row by row) */
static void embedding_row(const void *embed, int format, int64_t token, int64_t D, float *out) {
    if (format == WEIGHTS_BLOCKS) {
        block_matrix_row(embed, D, token, out);
        return;
    }
    for (int64_t d = 0; d < D; d++) out[d] = weight_at(embed, token * D + d, format);
}

/* out (D) = the view's embedding row of `token`, times its embed_scale where it has one (Gemma) */
static void embed_token(const ModelView *m, int64_t token, float *out) {
    embedding_row(m->embed, m->embed_format, token, m->D, out);
    if (m->embed_scale != 0.0f)
        for (int64_t d = 0; d < m->D; d++) out[d] *= m->embed_scale;
}

static void rms_norm_rows(const float *x, const void *w, float *out, int64_t T, int64_t D, float eps, int format) {
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * D;
        vf lanes = vf_zero();  /* the sum of squares: VL lanes in order, a tail, the fixed reduction */
        int64_t d = 0;
        for (; d + VL <= D; d += VL) lanes = vf_fma(lanes, vf_load(row + d), vf_load(row + d));
        float tail = 0.0f;
        for (; d < D; d++) tail = tail + row[d] * row[d];
        const float sum = vf_reduce(lanes) + tail;
        const float inverse = 1.0f / sqrtf(sum / (float)D + eps);
        for (d = 0; d < D; d++) out[t * D + d] = weight_at(w, d, format) * (row[d] * inverse);
    }
}

/* The model's final RMSNorm over T rows (a decode step or verify pass after fused_layers_f32): one call instead of
 * a handful of small torch ops. Each row alone, as in the layers. */
void rms_norm_f32(const float *x, const void *w, float *out, int64_t T, int64_t D, float eps, int format) {
    rms_norm_rows(x, w, out, T, D, eps, format);
}

/* Each of `heads` heads of v (heads, Dh): its leading R dims rotated by the position's cos/sin (R) as
 * x * cos + rotate_half(x) * sin, the rest left as they are (R < Dh: partial rotary) */
static void rope_rows(float *v, const float *cos_t, const float *sin_t, int64_t heads, int64_t Dh, int64_t R) {
    const int64_t half = R / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *x = v + h * Dh;
        float rotated[MAX_HEAD_DIM];  /* interface.h: the fused calls take no wider head */
        for (int64_t d = 0; d < half; d++) {
            rotated[d] = -x[d + half];
            rotated[d + half] = x[d];
        }
        for (int64_t d = 0; d < R; d++) x[d] = x[d] * cos_t[d] + rotated[d] * sin_t[d];
    }
}

/* x (T, D) += out (T, D), where the layer has one after normalizing out by `post_norm` first (Gemma's norms of the
 * attention's and the feed-forward's outputs); one thread */
static void add_residual(float *x, float *out, const void *post_norm, int64_t T, int64_t D, float eps, int format) {
    if (post_norm) rms_norm_rows(out, post_norm, out, T, D, eps, format);
    for (int64_t i = 0; i < T * D; i++) x[i] += out[i];
}

/* Decoder layer l of the view for a few rows, run by a team of threads (this thread is `part` of `parts`): the
 * matmuls and the attention split between them, the small row-wise steps on one thread, barriers between. The same
 * row-by-row operations as a 1-row call, so each row's result does not depend on how many rows share the call.
 * cos/sin (T, rope_stride) are the rows' rotary tables; keys/values this layer's cache (Hkv, S_max, Dh), or NULL
 * with `hier`. */
static void layer_team(const ModelView *m, int64_t l, float *x, int64_t T, const float *cos_table,
                       const float *sin_table, float *keys, float *values, const HierarchicalCache *hier,
                       int64_t S_max, int64_t start, const int64_t *parents, const RowSlots *rows, float *scratch,
                       void *prepared, int part, int parts) {
    const int64_t D = m->D, H = m->H, Hkv = m->Hkv, Dh = m->Dh, I = m->I, R = m->R, window = m->windows[l];
    const float eps = m->eps;
    const int format = m->format;
    const void *const *w = m->layers[l].slots;
    const void *attn_norm = w[SLOT_ATTN_NORM], *wqkv = w[SLOT_WQKV], *q_norm = w[SLOT_Q_NORM];
    const void *k_norm = w[SLOT_K_NORM], *wo = w[SLOT_WO], *ffn_norm = w[SLOT_FFN_NORM];
    const void *w_gate_up = w[SLOT_W_GATE_UP], *w_down = w[SLOT_W_DOWN];
    const void *post_attn_norm = w[SLOT_POST_ATTN_NORM], *post_ffn_norm = w[SLOT_POST_FFN_NORM];
    const float *qkv_bias = w[SLOT_QKV_BIAS], *o_bias = w[SLOT_O_BIAS], *gate_up_bias = w[SLOT_GATE_UP_BIAS];
    const float *down_bias = w[SLOT_DOWN_BIAS];
    const float *cos_rows = cos_table + m->rope_offsets[l], *sin_rows = sin_table + m->rope_offsets[l];
    const int64_t Q = H * Dh, KV = Hkv * Dh, N = Q + 2 * KV;
    float *normed = scratch;                /* (T, D) */
    float *qkv = normed + T * D;            /* (T, N) */
    float *attended = qkv + T * N;          /* (T, Q) as (H, T, Dh) blocks below */
    float *q_heads = attended + T * Q;      /* (H, T, Dh) */
    float *gate_up = q_heads + T * Q;       /* (T, 2I) */
    float *scores = gate_up + T * 2 * I;    /* H * T * (start + T) */
    float *cached_keys = scores + H * T * (start + T);            /* (Hkv, start + T, Dh) each: a hierarchical */
    float *cached_values = cached_keys + Hkv * (start + T) * Dh;  /* cache's rows dequantized for the attention */

#pragma omp single
    rms_norm_rows(x, attn_norm, normed, T, D, eps, format);
    team_matmul(normed, wqkv, qkv_bias, qkv, T, N, D, format, prepared, part, parts);
#pragma omp single
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * N;           /* q (H, Dh) | k (Hkv, Dh) | v (Hkv, Dh) */
        if (q_norm) {
            for (int64_t h = 0; h < H; h++) rms_norm_rows(row + h * Dh, q_norm, row + h * Dh, 1, Dh, eps, format);
            for (int64_t h = 0; h < Hkv; h++)
                rms_norm_rows(row + Q + h * Dh, k_norm, row + Q + h * Dh, 1, Dh, eps, format);
        }
        rope_rows(row, cos_rows + t * m->rope_stride, sin_rows + t * m->rope_stride, H, Dh, R);
        rope_rows(row + Q, cos_rows + t * m->rope_stride, sin_rows + t * m->rope_stride, Hkv, Dh, R);
        const int64_t slot = rows ? rows->slots[t] : start + t;  /* RowSlots: each sequence's own region */
        for (int64_t h = 0; h < Hkv && !hier; h++) {
            memcpy(keys + (h * S_max + slot) * Dh, row + Q + h * Dh, Dh * sizeof(float));
            memcpy(values + (h * S_max + slot) * Dh, row + Q + KV + h * Dh, Dh * sizeof(float));
        }
        for (int64_t h = 0; h < H; h++) memcpy(q_heads + (h * T + t) * Dh, row + h * Dh, Dh * sizeof(float));
    }
    if (hier) {  /* quantize the rows' keys/values into the cache, then read the prefix back as float32 */
#pragma omp single
        hierarchical_store(hier, l, qkv + Q, qkv + Q + KV, N, T, start, Hkv, Dh, S_max);
        hierarchical_load_share(hier, l, cached_keys, cached_values, start + T, Hkv, Dh, S_max, part, parts);
#pragma omp barrier
        attention_share(q_heads, cached_keys, cached_values, attended, scores, H, Hkv, T, Dh, (start + T) * Dh, start,
                        window, m->scale, parents, NULL, part, parts);
    } else {
        attention_share(q_heads, keys, values, attended, scores, H, Hkv, T, Dh, S_max * Dh, start, window, m->scale,
                        parents, rows, part, parts);
    }
#pragma omp barrier
#pragma omp single
    for (int64_t t = 0; t < T; t++)        /* (H, T, Dh) -> (T, H*Dh), reusing qkv as the row buffer */
        for (int64_t h = 0; h < H; h++) memcpy(qkv + t * Q + h * Dh, attended + (h * T + t) * Dh, Dh * sizeof(float));
    team_matmul(qkv, wo, o_bias, normed, T, D, Q, format, prepared, part, parts);
#pragma omp single
    {
        add_residual(x, normed, post_attn_norm, T, D, eps, format);
        rms_norm_rows(x, ffn_norm, normed, T, D, eps, format);
    }
    team_matmul(normed, w_gate_up, gate_up_bias, gate_up, T, 2 * I, D, format, prepared, part, parts);
    team_gated_matmul(gate_up, w_down, down_bias, normed, T, D, I, m->activation, format, prepared, part, parts);
#pragma omp single
    add_residual(x, normed, post_ffn_norm, T, D, eps, format);
}

/* The scratch floats layer_team carves for T rows attending to `span` positions (start + T): its buffers above, summed.
 * The entry points' *_scratch functions below add their own buffers to it; the Python side asks them before each
 * call (edge/kernels/cpu_kernel.py), so each size is written once, beside the carving it measures. */
static int64_t layer_scratch(const ModelView *m, int64_t T, int64_t span, int hierarchical) {
    const int64_t Q = m->H * m->Dh, KV = m->Hkv * m->Dh;
    const int64_t rows = T * (m->D + (Q + 2 * KV) + Q + Q + 2 * m->I);  /* normed, qkv, attended, q_heads, gate_up */
    const int64_t dequantized = hierarchical ? 2 * m->Hkv * span * m->Dh : 0;  /* cached_keys, cached_values */
    return rows + m->H * T * span + dequantized;                               /* + scores */
}

/* Room for T rows' prepared activations at the widest input of any of the model's matmuls */
static void *layers_prepared(const ModelView *m, int64_t T) {
    const int64_t Q = m->H * m->Dh, widest = m->D > Q ? (m->D > m->I ? m->D : m->I) : (Q > m->I ? Q : m->I);
    return prepared_alloc(T, widest);
}

/* The rows' residual streams x (T, D) after layer l, copied where `capture` asks for them (Capture); one thread */
static void capture_rows(const Capture *capture, int64_t l, const float *x, int64_t T, int64_t D) {
    for (int64_t c = 0; c < capture->count; c++) {
        if (capture->layers[c] != l) continue;
        for (int64_t t = 0; t < T; t++)
            memcpy(capture->rows + t * capture->row_stride + c * D, x + t * D, D * sizeof(float));
    }
}

/* This thread's part of layers order[0 .. count) on x (T, D), inside the team's parallel region; with `capture`
 * (else NULL) the residual streams after the layers it names are copied out as each one finishes */
static void layers_in_team(const ModelView *m, float *x, int64_t T, int64_t start, const int64_t *order,
                           int64_t count, const float *cos_table, const float *sin_table, float *keys, float *values,
                           const HierarchicalCache *hier, int64_t S_max, int64_t layer_stride,
                           const int64_t *parents, const RowSlots *rows, const Capture *capture, float *scratch,
                           void *prepared, int part, int parts) {
    for (int64_t i = 0; i < count; i++) {
        const int64_t l = order[i];
        layer_team(m, l, x, T, cos_table, sin_table, hier ? NULL : keys + l * layer_stride,
                   hier ? NULL : values + l * layer_stride, hier, S_max, start, parents, rows, scratch, prepared, part,
                   parts);
        if (capture) {  /* layer_team ends in a single's barrier: every thread has finished x */
#pragma omp single
            capture_rows(capture, l, x, T, m->D);
        }
    }
}

/* Several decoder layers in one call (a decode step or verify pass through the model, or a self-draft's subset):
 * layer order[i], i = 0 .. count - 1, one after another on the same x (T, D), in one parallel region. The view's
 * layers and what they compute are read (its embedding, norm and head are not); keys/values are the whole cache
 * (L, Hkv, S_max, Dh), layer l at + l * layer_stride. Keys/values of the T rows are written into the cache at
 * [start, start + T) before the attention reads [0, start + t] for row t. cos/sin (T, rope_stride) are the rotary
 * tables of the rows' positions (ModelView). With `hier` (QuantSpec's hierarchical cache, kv_hierarchical.c) the
 * cache is that instead, and keys/values are unused. With `capture` (else NULL) the rows' residual streams after the
 * layers it names are copied out (Capture). scratch holds fused_layers_scratch(m, T, start, hier != NULL) floats. */
void fused_layers_f32(const ModelView *m, float *x, int64_t T, int64_t start, const int64_t *order, int64_t count,
                      const float *cos_table, const float *sin_table, float *keys, float *values,
                      const HierarchicalCache *hier, int64_t S_max, int64_t layer_stride, const Capture *capture,
                      float *scratch, int threads) {
    void *prepared = layers_prepared(m, T);
#pragma omp parallel num_threads(threads)
    layers_in_team(m, x, T, start, order, count, cos_table, sin_table, keys, values, hier, S_max, layer_stride, NULL,
                   NULL, capture, scratch, prepared, omp_get_thread_num(), omp_get_num_threads());
    free(prepared);
}

int64_t fused_layers_scratch(const ModelView *m, int64_t T, int64_t start, int hierarchical) {
    return layer_scratch(m, T, start + T, hierarchical);
}

/* A decode step or verify pass through the whole model in one parallel region: the embedding rows of tokens (T)
 * (times embed_scale), the layers `order`, the final norm into hidden (T, D) and the head into logits (T, V), capped
 * where the view says (softcap). The same operations, row by row, as fused_layers_f32, rms_norm_f32 and the head's
 * matmul called one after another. cos/sin (T, rope_stride) are the rows' rotary tables; keys/values the cache
 * (L, Hkv, S_max, Dh), layer l at + l * layer_stride, or `hier` (as in fused_layers_f32). With parents (T) the rows
 * are a token tree (attention.c): row t continues row parents[t] (-1: the cache), its rotary rows are those of its
 * depth's position, and its keys/values are still stored at slot start + t (the caller keeps the accepted path's
 * slots and moves them into place). With rows (RowSlots, else NULL) the rows are several sequences' (continuous
 * batching): row t's keys/values go to slot rows->slots[t] and it attends to its own sequence's slots; `start` is then
 * 1 + the largest slot - T (interface.h). `capture` as in fused_layers_f32. scratch holds forward_step_scratch(m, T, start,
 * hier != NULL) floats. */
void forward_step_f32(const ModelView *m, const int64_t *tokens, int64_t T, int64_t start, const int64_t *order,
                      int64_t count, const float *cos_table, const float *sin_table, float *keys, float *values,
                      const HierarchicalCache *hier, int64_t S_max, int64_t layer_stride, const int64_t *parents,
                      const RowSlots *rows, const Capture *capture, float *hidden, float *logits, float *scratch,
                      int threads) {
    const int64_t D = m->D;
    float *x = scratch, *layer_scratch = scratch + T * D;
    for (int64_t t = 0; t < T; t++) embed_token(m, tokens[t], x + t * D);
    void *prepared = layers_prepared(m, T);
#pragma omp parallel num_threads(threads)
    {
        const int part = omp_get_thread_num(), parts = omp_get_num_threads();
        layers_in_team(m, x, T, start, order, count, cos_table, sin_table, keys, values, hier, S_max, layer_stride,
                       parents, rows, capture, layer_scratch, prepared, part, parts);
#pragma omp single
        rms_norm_rows(x, m->norm, hidden, T, D, m->eps, m->norm_format);
        team_matmul(hidden, m->head, NULL, logits, T, m->V, D, m->head_format, prepared, part, parts);
        if (m->softcap != 0.0f) {  /* per element: any split of the logits between the threads gives the same bits */
            const int64_t total = T * m->V, first = total * part / parts, end = total * (part + 1) / parts;
            softcap_span(logits + first, end - first, m->softcap);
        }
    }
    free(prepared);
}

int64_t forward_step_scratch(const ModelView *m, int64_t T, int64_t start, int hierarchical) {
    return T * m->D + layer_scratch(m, T, start + T, hierarchical);  /* x, then the layers' */
}

/* Greedy drafting, k tokens in one call: a draft model (embed -> layers -> norm -> head -> argmax) or a feature
 * drafter (fc(feature | embed) -> its layer -> norm -> head -> argmax, its normed output becoming the next row's
 * feature). The same per-row operations as the Python path's calls, without a Python round trip per token.
 *
 * The first step runs a->T0 rows at positions [start, start + T0): tokens[t] (and features[t] when fc is set); each
 * later step runs one row: the token just drafted (and the previous step's normed output). A feature drafter's
 * embedding rows are not scaled by embed_scale (its fc takes them as they are stored). Keys/values are written
 * into the drafter's cache as the layers run. The view's embedding and head are read in their own formats (WEIGHTS_INT8:
 * packed, WEIGHTS_BLOCKS: a BlockMatrix), its norm in norm_format, and the layers and fc in its format. The cache is
 * keys/values or `hier`, as in fused_layers_f32. scratch holds draft_greedy_scratch(m, T0, start, k, hier != NULL)
 * floats. out[i] receives draft token i.
 * With stop_below > 0, drafting stops before a token (never the first) whose softmax probability is below it.
 * With runners_up, step i's second most likely token goes to runners_up[i], and the probabilities of the draft token
 * and of the runner-up to probabilities[2i], [2i + 1]: what a token tree is built from.
 * Returns how many tokens were drafted (k unless it stopped). */
int64_t draft_greedy_f32(const ModelView *m, const DraftArgs *a, float *keys, float *values,
                         const HierarchicalCache *hier, int64_t S_max, int64_t layer_stride, float *scratch,
                         int threads) {
    const int64_t D = m->D, V = m->V, T0 = a->T0, k = a->k;
    float *x = scratch;                     /* (T0, D) the rows being run */
    float *joined = x + T0 * D;             /* (T0, 2D) feature | embedding, the fc's input */
    float *normed = joined + 2 * T0 * D;    /* (D) the last row after the norm: the next feature */
    float *logits = normed + D;             /* (V) */
    float *layer_scratch = logits + V;
    int64_t T = T0, position = a->start;
    const int64_t *step_tokens = a->tokens;
    const float *step_features = a->features;
    for (int64_t i = 0; i < k; i++) {
        for (int64_t t = 0; t < T; t++) {
            if (a->fc) {
                embedding_row(m->embed, m->embed_format, step_tokens[t], D, joined + t * 2 * D + D);
                memcpy(joined + t * 2 * D, step_features + t * D, D * sizeof(float));
            } else {
                embed_token(m, step_tokens[t], x + t * D);
            }
        }
        if (a->fc) rowwise_matmul(joined, a->fc, NULL, x, T, D, 2 * D, m->format, threads);
        fused_layers_f32(m, x, T, position, a->order, a->count, a->cos_table + position * m->rope_stride,
                         a->sin_table + position * m->rope_stride, keys, values, hier, S_max, layer_stride, NULL,
                         layer_scratch, threads);
        rms_norm_rows(x + (T - 1) * D, m->norm, normed, 1, D, m->eps, m->norm_format);
        rowwise_matmul(normed, m->head, NULL, logits, 1, V, D, m->head_format, threads);
        if (m->softcap != 0.0f) softcap_span(logits, V, m->softcap);
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;  /* the first of equal maxima, as torch.argmax */
        if ((a->stop_below > 0.0f && i > 0) || a->runners_up) {
            double total = 0.0;  /* the best token's probability is 1 / sum(exp(logit - best logit)) */
            for (int64_t v = 0; v < V; v++) total += expf(logits[v] - logits[best]);
            if (a->stop_below > 0.0f && i > 0 && 1.0 / total < a->stop_below) return i;
            if (a->runners_up) {  /* the runner-up too: a token tree's candidate beside the draft's own */
                int64_t second = best == 0 ? 1 : 0;
                for (int64_t v = second + 1; v < V; v++)
                    if (v != best && logits[v] > logits[second]) second = v;
                a->runners_up[i] = a->head_ids ? a->head_ids[second] : second;
                a->probabilities[2 * i] = (float)(1.0 / total);
                a->probabilities[2 * i + 1] = (float)(exp((double)logits[second] - logits[best]) / total);
            }
        }
        a->out[i] = a->head_ids ? a->head_ids[best] : best;
        position += T;
        T = 1;
        step_tokens = a->out + i;
        step_features = normed;
    }
    return k;
}

int64_t draft_greedy_scratch(const ModelView *m, int64_t T0, int64_t start, int64_t k, int hierarchical) {
    /* x, joined, normed and logits, then the layers' for the first step's rows over every position a step reaches */
    return 3 * T0 * m->D + m->D + m->V + layer_scratch(m, T0, start + T0 + k, hierarchical);
}
