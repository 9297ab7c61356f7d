/* QuantSpec's hierarchical KV cache in the fused step: keys/values stored as 8-bit asymmetric codes split into an
 * upper and a lower nibble plane (edge/kernels/kv_quant.py is the specification), quantized as each row is appended and
 * dequantized into float32 rows for the attention. The target reads both planes (8 bits), the draft the upper one
 * alone (4 bits, the centre of the 16 codes it covers): the same memory, half the bytes.
 *
 * Each vector (one token, one KV head) is quantized on its own and each value dequantized on its own, so a row's
 * stored codes and the attention's inputs do not depend on how many rows share a call: a verify pass stores and
 * reads exactly what decode steps do.
 *
 * Keys may carry per-channel scales (powers of two, edge/model/key_scales.py): a key is divided by them before it is
 * quantized and multiplied back as it is read, so a few outlier channels (Qwen's) do not set every channel's step.
 */
#include "simd.h"

/* One vector x (Dh) into 8-bit codes c = round((x - low) / step), low = min(x), step = (max(x) - low) / 255, each kept
 * in float16 as the reference does; the codes' upper and lower nibbles into two planes, two values a byte, low nibble
 * first. */
static void store_vector(const float *x, int64_t Dh, uint8_t *upper, uint8_t *lower, uint16_t *step_out,
                         uint16_t *low_out) {
    float smallest = x[0], largest = x[0];
    for (int64_t d = 1; d < Dh; d++) {
        smallest = x[d] < smallest ? x[d] : smallest;
        largest = x[d] > largest ? x[d] : largest;
    }
    const uint16_t low_bits = f32_to_f16(smallest);
    const float low = f16_to_f32(low_bits);
    float spread = (largest - low) / 255.0f;
    spread = spread < 1e-8f ? 1e-8f : spread;
    const uint16_t step_bits = f32_to_f16(spread);
    const float step = f16_to_f32(step_bits);
    for (int64_t d = 0; d < Dh; d += 2) {
        uint8_t codes[2];
        for (int i = 0; i < 2; i++) {
            float code = step > 0.0f ? nearbyintf((x[d + i] - low) / step) : 0.0f;  /* a constant vector: all 0 */
            code = code < 0.0f ? 0.0f : (code > 255.0f ? 255.0f : code);
            codes[i] = (uint8_t)code;
        }
        upper[d / 2] = (uint8_t)((codes[0] >> 4) | (codes[1] & 0xf0));
        lower[d / 2] = (uint8_t)((codes[0] & 0x0f) | ((codes[1] & 0x0f) << 4));
    }
    *step_out = step_bits;
    *low_out = low_bits;
}

/* Rows t = 0 .. T-1 of keys and values (each (Hkv, Dh) at + t * row_stride) into positions start + t of one layer */
void hierarchical_store(const HierarchicalCache *cache, int64_t layer, const float *keys, const float *values,
                        int64_t row_stride, int64_t T, int64_t start, int64_t Hkv, int64_t Dh, int64_t S_max) {
    const HierarchicalPlanes *stores[2] = {&cache->keys, &cache->values};
    const float *sources[2] = {keys, values};
    float scaled[MAX_HEAD_DIM];  /* interface.h: the fused step takes no wider head */
    for (int which = 0; which < 2; which++) {
        const HierarchicalPlanes *p = stores[which];
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < Hkv; h++) {
                const int64_t slot = (layer * Hkv + h) * S_max + start + t;  /* (L, Hkv, S_max) */
                const float *x = sources[which] + t * row_stride + h * Dh;
                if (which == 0 && cache->key_scales) {  /* exact: the scales are powers of two */
                    const float *scales = cache->key_scales + (layer * Hkv + h) * Dh;
                    for (int64_t d = 0; d < Dh; d++) scaled[d] = x[d] / scales[d];
                    x = scaled;
                }
                store_vector(x, Dh, p->upper + slot * (Dh / 2), p->lower + slot * (Dh / 2), p->step + slot,
                             p->low + slot);
            }
    }
}

/* This thread's share of positions [0, span) of one layer, dequantized into keys_out/values_out (Hkv, span, Dh):
 * low + code * step, code = 16 * upper + lower for the target, 16 * upper + 7.5 for the draft. */
void hierarchical_load_share(const HierarchicalCache *cache, int64_t layer, float *keys_out, float *values_out,
                             int64_t span, int64_t Hkv, int64_t Dh, int64_t S_max, int part, int parts) {
    const HierarchicalPlanes *stores[2] = {&cache->keys, &cache->values};
    float *outputs[2] = {keys_out, values_out};
    const int64_t units = 2 * Hkv * span;
    for (int64_t unit = units * part / parts; unit < units * (part + 1) / parts; unit++) {
        const int which = (int)(unit / (Hkv * span));
        const int64_t h = unit / span % Hkv, position = unit % span;
        const HierarchicalPlanes *p = stores[which];
        const int64_t slot = (layer * Hkv + h) * S_max + position;
        const uint8_t *upper = p->upper + slot * (Dh / 2), *lower = p->lower + slot * (Dh / 2);
        const float step = f16_to_f32(p->step[slot]), low = f16_to_f32(p->low[slot]);
        float *out = outputs[which] + (h * span + position) * Dh;
        if (cache->draft) {
            for (int64_t d = 0; d < Dh / 2; d++) {
                out[2 * d] = low + ((float)(upper[d] & 0x0f) * 16.0f + 7.5f) * step;
                out[2 * d + 1] = low + ((float)(upper[d] >> 4) * 16.0f + 7.5f) * step;
            }
        } else {
            for (int64_t d = 0; d < Dh / 2; d++) {
                out[2 * d] = low + (float)((upper[d] & 0x0f) * 16 + (lower[d] & 0x0f)) * step;
                out[2 * d + 1] = low + (float)((upper[d] >> 4) * 16 + (lower[d] >> 4)) * step;
            }
        }
        if (which == 0 && cache->key_scales) {
            const float *scales = cache->key_scales + (layer * Hkv + h) * Dh;
            for (int64_t d = 0; d < Dh; d++) out[d] *= scales[d];
        }
    }
}
