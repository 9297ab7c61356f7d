/* Batch-invariant attention for a few queries at positions start .. start + T - 1 over a float32 KV cache.
 *
 * q, out: (H, T, D) contiguous; keys, values: (Hkv, S_max, D) with row stride D and head stride kv_head_stride.
 * Query t sees keys [lo, start + t], lo = start + t - window + 1 when a sliding window is set (window > 0).
 * Each (head, query) is computed alone and in a fixed order: scores q . k_j (VL lanes over d, a tail, the fixed
 * reduction), their maximum, exp and sum in VL-key blocks from lo, values accumulated in key order; so its result
 * does not depend on T, on which queries share a pass or on the thread count. scratch holds H * T * (start + T)
 * floats for the scores.
 *
 * A token tree (parents != NULL) verifies several candidate continuations in one pass: row t sits at depth d(t) below
 * the cache (parents[t] is the row it continues, -1 for the first row), at position start + d(t), and sees the
 * cache's keys [lo, start) and then the rows on its own path, in depth order. Its arithmetic is that of a chain's
 * query at that position over those keys (the same per-key scores, the same exp-sum lanes, the same value order),
 * so the rows of the path that is accepted compute exactly what decode steps compute.
 */
#include <omp.h>

#include "simd.h"

/* The dot product of a query and a key over the columns [whole, D) past the last whole vector, in column order */
static inline float tail_dot(const float *query, const float *key, int64_t whole, int64_t D) {
    float tail = 0.0f;
    for (int64_t d = whole; d < D; d++) tail = tail + query[d] * key[d];
    return tail;
}

/* scores[j] = (q . k_j) * scale for j in [lo, hi]: VL keys side by side (independent chains, their lane sums taken
 * together by vf_reduce_many), the rest one by one; every key's operations are the same either way */
static void score_keys(const float *query, const float *k, float *scores, int64_t lo, int64_t hi, int64_t D,
                       float scale) {
    const int64_t whole = D - D % VL;
    int64_t j0 = lo;
    for (; j0 + VL <= hi + 1; j0 += VL) {
        vf lanes[VL];
        float sums[VL];
        _Pragma("GCC unroll 16") for (int i = 0; i < VL; i++) lanes[i] = vf_zero();
        for (int64_t d = 0; d < whole; d += VL) {
            const vf qv = vf_load(query + d);
            _Pragma("GCC unroll 16") for (int i = 0; i < VL; i++)
                lanes[i] = vf_fma(lanes[i], qv, vf_load(k + (j0 + i) * D + d));
        }
        vf_reduce_many(lanes, sums);
        for (int i = 0; i < VL; i++) scores[j0 + i] = (sums[i] + tail_dot(query, k + (j0 + i) * D, whole, D)) * scale;
    }
    for (int64_t j = j0; j <= hi; j++) {
        vf lanes = vf_zero();
        for (int64_t d = 0; d < whole; d += VL) lanes = vf_fma(lanes, vf_load(query + d), vf_load(k + j * D + d));
        scores[j] = (vf_reduce(lanes) + tail_dot(query, k + j * D, whole, D)) * scale;
    }
}

/* Softmax weights from scores [lo, hi] in place: scores[j] = exp(score_j - max); returns their sum. */
static float softmax_weights(float *scores, int64_t lo, int64_t hi) {
    float top = -INFINITY;  /* a maximum: the same in any order */
    int64_t j = lo;
    if (hi + 1 - lo >= VL) {
        vf tops = vf_load(scores + lo);
        for (j = lo + VL; j + VL <= hi + 1; j += VL) tops = vf_max(tops, vf_load(scores + j));
        float lanes[VL];
        vf_store(lanes, tops);
        for (int i = 0; i < VL; i++) top = lanes[i] > top ? lanes[i] : top;
    }
    for (; j <= hi; j++) top = scores[j] > top ? scores[j] : top;
    vf sums = vf_zero();
    for (j = lo; j + VL <= hi + 1; j += VL) {  /* whole vectors in place */
        const vf exps = vf_exp(vf_sub(vf_load(scores + j), vf_set(top)));
        vf_store(scores + j, exps);
        sums = vf_add(sums, exps);
    }
    for (; j <= hi; j += VL) {
        const int64_t count = hi + 1 - j < VL ? hi + 1 - j : VL;
        float block[VL], exps[VL];
        for (int64_t lane = 0; lane < VL; lane++) block[lane] = lane < count ? scores[j + lane] - top : -INFINITY;
        vf_store(exps, vf_exp(vf_load(block)));
        for (int64_t lane = count; lane < VL; lane++) exps[lane] = 0.0f;  /* padding adds nothing */
        memcpy(scores + j, exps, count * sizeof(float));
        sums = vf_add(sums, vf_load(exps));
    }
    return vf_reduce(sums);
}

/* Softmax weights of one query over keys [lo, hi]: scores[j] = exp(score_j - max); returns their sum. */
static float query_scores(const float *query, const float *k, float *scores, int64_t lo, int64_t hi, int64_t D,
                          float scale) {
    score_keys(query, k, scores, lo, hi, D, scale);
    return softmax_weights(scores, lo, hi);
}

/* One query of a token tree over logical positions [lo, start + depth]: position p < start is cache slot p, position
 * start + i is row path[i] of the pass (slot start + path[i]; path[depth] is the query's own row). The scores, the
 * softmax and the value sums are those of query_scores and weighted_values for one query over a contiguous prefix,
 * operation for operation, with only the slots of the rows changed. */
static void tree_query(const float *query, const float *k, const float *v, float *out, float *scores,
                       const int64_t *path, int64_t depth, int64_t start, int64_t lo, int64_t D, float scale) {
    const int64_t hi = start + depth, whole = D - D % VL;
    if (lo < start) score_keys(query, k, scores, lo, start - 1, D, scale);
    for (int64_t p = lo > start ? lo : start; p <= hi; p++)  /* key p read from its row's slot */
        score_keys(query, k + (start + path[p - start] - p) * D, scores, p, p, D, scale);
    const float inverse = 1.0f / softmax_weights(scores, lo, hi);
    for (int64_t c = 0; c < whole; c += VL) {
        vf acc = vf_zero();
        for (int64_t p = lo; p <= hi; p++) {
            const int64_t slot = p < start ? p : start + path[p - start];
            acc = vf_fma(acc, vf_set(scores[p]), vf_load(v + slot * D + c));
        }
        vf_store(out + c, acc);
    }
    for (int64_t d = whole; d < D; d++) {
        float sum = 0.0f;
        for (int64_t p = lo; p <= hi; p++) {
            const int64_t slot = p < start ? p : start + path[p - start];
            sum = sum + scores[p] * v[slot * D + d];
        }
        out[d] = sum;
    }
    for (int64_t d = 0; d < D; d++) out[d] *= inverse;
}

/* N queries' weighted sums of value rows over W * VL columns from column c, in registers (N and W compile-time):
 * acc accumulates weight_j * v_j for j = lo[i] .. hi[i] in key order, one multiply-add each, then is stored. */
static inline __attribute__((always_inline)) void value_block(const float *const *weights, float *const *results,
                                                              const int64_t *lo, const int64_t *hi, int64_t first,
                                                              int64_t last, const float *v, int64_t D, int64_t c,
                                                              const int N, const int W) {
    vf acc[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < N; i++)
        _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) acc[i][w] = vf_zero();
    for (int64_t j = first; j <= last; j++) {
        const float *row = v + j * D + c;
        vf column[4];
        _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) column[w] = vf_load(row + VL * w);
        _Pragma("GCC unroll 4") for (int i = 0; i < N; i++) {
            if (j < lo[i] || j > hi[i]) continue;
            const vf scale = vf_set(weights[i][j]);
            _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) acc[i][w] = vf_fma(acc[i][w], scale, column[w]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < N; i++)
        _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) vf_store(results[i] + c + VL * w, acc[i][w]);
}

#define VALUE_QUERIES 4
#define VALUE_CASE(N, W) \
    case N: value_block(weights, results, lo, hi, first, last, v, D, c, N, W); break;

/* Up to 4 queries' attention outputs from their softmax weights: value_block over 4 * VL columns at a time, then
 * VL, a scalar loop for a D % VL tail (the same multiply-add order), then the division by each query's total. */
static void weighted_values(const float *const *weights, float *const *results, const int64_t *lo, const int64_t *hi,
                            const float *inverse, int n, const float *v, int64_t D) {
    int64_t first = lo[0], last = hi[0];
    for (int i = 1; i < n; i++) {
        if (lo[i] < first) first = lo[i];
        if (hi[i] > last) last = hi[i];
    }
    int64_t c = 0;
    for (; c + 4 * VL <= D; c += 4 * VL)
        switch (n) { VALUE_CASE(1, 4) VALUE_CASE(2, 4) VALUE_CASE(3, 4) VALUE_CASE(4, 4) }
    for (; c + VL <= D; c += VL)
        switch (n) { VALUE_CASE(1, 1) VALUE_CASE(2, 1) VALUE_CASE(3, 1) VALUE_CASE(4, 1) }
    for (int i = 0; i < n; i++) {
        for (int64_t d = c; d < D; d++) {
            float sum = 0.0f;
            for (int64_t j = lo[i]; j <= hi[i]; j++) sum = sum + weights[i][j] * v[j * D + d];
            results[i][d] = sum;
        }
        for (int64_t d = 0; d < D; d++) results[i][d] *= inverse[i];
    }
}

/* One thread's share of the attention: work is split by KV head, so each key and value row is read for all the
 * queries that share it (a GQA group's heads, every row of a verify pass); a KV head's queries are split further when
 * there are fewer KV heads than threads. Each query's arithmetic is the same however the queries are grouped. */
void attention_share(const float *q, const float *keys, const float *values, float *out, float *scratch, int64_t H,
                     int64_t Hkv, int64_t T, int64_t D, int64_t kv_head_stride, int64_t start, int64_t window,
                     float scale, const int64_t *parents, const RowSlots *rows, int part, int parts) {
    const int64_t group = H / Hkv, span = start + T, per_head = group * T;
    int64_t splits = (parts + Hkv - 1) / Hkv;
    if (splits > per_head) splits = per_head;
    if (splits < 1) splits = 1;
    const int64_t units = Hkv * splits;
    for (int64_t unit = units * part / parts; unit < units * (part + 1) / parts; unit++) {
        const int64_t kv = unit / splits, piece = unit % splits;
        const int64_t first = per_head * piece / splits, end = per_head * (piece + 1) / splits;
        const float *k = keys + kv * kv_head_stride, *v = values + kv * kv_head_stride;
        if (parents) {  /* a token tree: each query over its own path */
            for (int64_t i = first; i < end; i++) {
                const int64_t ht = kv * per_head + i, t = ht % T;
                int64_t path[TREE_ROWS], depth = 0;
                for (int64_t row = t; row >= 0; row = parents[row]) depth++;  /* rows on the path, root included */
                int64_t row = t;
                for (int64_t at = depth - 1; at >= 0; at--, row = parents[row]) path[at] = row;
                const int64_t position = start + depth - 1;
                const int64_t lo = (window > 0 && position - window + 1 > 0) ? position - window + 1 : 0;
                tree_query(q + ht * D, k, v, out + ht * D, scratch + ht * span, path, depth - 1, start, lo, D, scale);
            }
            continue;
        }
        for (int64_t i0 = first, n = 0; i0 < end; i0 += n) {
            const float *weights[VALUE_QUERIES];
            float *results[VALUE_QUERIES], inverse[VALUE_QUERIES];
            int64_t lo[VALUE_QUERIES], hi[VALUE_QUERIES];
            n = end - i0 < VALUE_QUERIES ? (int)(end - i0) : VALUE_QUERIES;
            if (rows)  /* several sequences' rows: a group stays within one sequence's region, or the value rows
                        * between the regions would be walked for nothing (a query's sums do not depend on its group) */
                for (int64_t i = 1; i < n; i++)
                    if (rows->firsts[(kv * per_head + i0 + i) % T] != rows->firsts[(kv * per_head + i0) % T]) {
                        n = i;
                        break;
                    }
            for (int i = 0; i < n; i++) {
                const int64_t ht = kv * per_head + i0 + i, t = ht % T;  /* head ht / T */
                const int64_t position = rows ? rows->slots[t] : start + t, first = rows ? rows->firsts[t] : 0;
                lo[i] = (window > 0 && position - window + 1 > first) ? position - window + 1 : first;
                hi[i] = position;
                float *scores = scratch + ht * span;
                inverse[i] = 1.0f / query_scores(q + ht * D, k, scores, lo[i], hi[i], D, scale);
                weights[i] = scores;
                results[i] = out + ht * D;
            }
            weighted_values(weights, results, lo, hi, inverse, n, v, D);
        }
    }
}

void rowwise_attention_f32(const float *q, const float *keys, const float *values, float *out, float *scratch,
                           int64_t H, int64_t Hkv, int64_t T, int64_t D, int64_t kv_head_stride, int64_t start,
                           int64_t window, float scale, int threads) {
#pragma omp parallel num_threads(threads)
    attention_share(q, keys, values, out, scratch, H, Hkv, T, D, kv_head_stride, start, window, scale, NULL, NULL,
                    omp_get_thread_num(), omp_get_num_threads());
}
