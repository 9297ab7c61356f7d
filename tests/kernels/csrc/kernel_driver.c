/* Runs edge's CPU kernels from the command line, for testing a path this machine cannot load into Python (aarch64
 * under qemu-user; tests/kernels/test_kernels_aarch64.py builds and drives it).
 *
 *   kernel_driver matmul FORMAT M N K BIAS < x (M*K f32), weights, [bias (N f32)] > y (M*N f32), then y again
 *                 computed one row per call (the test checks the two are equal: batch invariance)
 *   kernel_driver attention H HKV T D START WINDOW < q (H*T*D), keys, values (HKV*(START+T)*D each)
 *                 > out (H*T*D f32), then out again computed one query position per call
 *   kernel_driver tree H HKV T D START < q (H*T*D), keys, values (HKV*(START+T)*D each), parents (T int64)
 *                 > out (H*T*D f32): the T rows as a token tree (row t continues row parents[t], -1 the cache)
 *   kernel_driver regions H HKV T D SPAN < q (H*T*D), keys, values (HKV*SPAN*D each), slots, firsts (T int64 each)
 *                 > out (H*T*D f32): rows of several sequences (RowSlots: row t attends to slots firsts[t] ..
 *                 slots[t]; SPAN is 1 + the largest slot), then out again computed one row per call
 *   kernel_driver hierarchical T HKV D < keys, values ((T, HKV, D) f32 each) > for keys then values: the upper and
 *                 lower planes ((HKV, T, D/2) bytes each), step and low ((HKV, T) float16 bits each); then the keys
 *                 read back for the target and for the draft ((HKV, T, D) f32 each)
 *
 *   kernel_driver blocks TYPE M N K < x (M*K f32), the GGUF tensor's bytes (N rows of K / B blocks) > y (M*N f32),
 *                 then y again one row per call: TYPE is ggml's type number (csrc/blocks.h), repacked here
 *   kernel_driver quantize TYPE N K < w (N*K f32) > edge's own quantization of w in the GGUF tensor layout (TYPE 3:
 *                 Q4_1, 8: Q8_0; csrc/blocks_quantize.c)
 *
 * FORMAT: f32, bf16, f16 (weights N*K of that type), i8 (packed bytes, edge/kernels/cpu_packing.py; their size
 * follows from N and K). Prints the kernel's path name to stderr.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interface.h"  /* edge/kernels/csrc: the structs and the exported functions, declared once */

static int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

static void *read_exactly(size_t bytes) {
    void *buffer = malloc(bytes ? bytes : 1);
    if (buffer == NULL || fread(buffer, 1, bytes, stdin) != bytes) {
        fprintf(stderr, "kernel_driver: short input (wanted %zu bytes)\n", bytes);
        exit(2);
    }
    return buffer;
}

static void write_floats(const float *values, int64_t count) { fwrite(values, sizeof(float), count, stdout); }

static void matmul(const char *format, const float *x, const void *w, const float *bias, float *y, int64_t M,
                   int64_t N, int64_t K) {
    static const char *const names[] = {"f32", "bf16", "f16", "i8"};
    static const int formats[] = {WEIGHTS_FLOAT32, WEIGHTS_BFLOAT16, WEIGHTS_FLOAT16, WEIGHTS_INT8};
    int code = 0;
    while (code < 3 && strcmp(format, names[code])) code++;
    rowwise_matmul(x, w, bias, y, M, N, K, formats[code], 2);
}

static size_t weight_bytes(const char *format, int64_t N, int64_t K) {
    if (!strcmp(format, "f32")) return (size_t)(N * K * 4);
    if (!strcmp(format, "bf16") || !strcmp(format, "f16")) return (size_t)(N * K * 2);
    if (!strcmp(format, "i8"))  /* codes, then a float32 scale and an int32 correction per output */
        return (size_t)(round_up(N, INT8_GROUP) * round_up(K, INT8_CHUNK) + 8 * round_up(N, INT8_GROUP));
    fprintf(stderr, "kernel_driver: unknown format %s\n", format);
    exit(2);
}

int main(int argc, char **argv) {
    fprintf(stderr, "%s\n", kernel_path());
    if (argc == 7 && !strcmp(argv[1], "matmul")) {
        const char *format = argv[2];
        const int64_t M = atoll(argv[3]), N = atoll(argv[4]), K = atoll(argv[5]), with_bias = atoll(argv[6]);
        float *x = read_exactly(M * K * sizeof(float));
        void *w = read_exactly(weight_bytes(format, N, K));
        float *bias = with_bias ? read_exactly(N * sizeof(float)) : NULL;
        float *y = malloc(M * N * sizeof(float)), *single = malloc(N * sizeof(float));
        matmul(format, x, w, bias, y, M, N, K);
        write_floats(y, M * N);
        for (int64_t m = 0; m < M; m++) {
            matmul(format, x + m * K, w, bias, single, 1, N, K);
            write_floats(single, N);
        }
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "blocks")) {
        const int type = atoi(argv[2]);
        const int64_t M = atoll(argv[3]), N = atoll(argv[4]), K = atoll(argv[5]);
        const int64_t weights = type >= 12 ? 256 : 32;
        static const int64_t block_bytes[15] = {0, 0, 18, 20, 0, 0, 22, 24, 34, 0, 0, 0, 144, 176, 210};
        float *x = read_exactly(M * K * sizeof(float));
        uint8_t *file = read_exactly(N * (K / weights) * block_bytes[type]);
        uint8_t *packed = malloc(blocks_packed_bytes(type, N, K));
        blocks_repack(type, file, N, K, packed, 2);
        const BlockMatrix matrix = {1, {type}, {N}, {packed}};
        float *y = malloc(M * N * sizeof(float)), *single = malloc(N * sizeof(float));
        rowwise_matmul(x, &matrix, NULL, y, M, N, K, WEIGHTS_BLOCKS, 2);
        write_floats(y, M * N);
        for (int64_t m = 0; m < M; m++) {
            rowwise_matmul(x + m * K, &matrix, NULL, single, 1, N, K, 5, 1);
            write_floats(single, N);
        }
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "quantize")) {
        const int type = atoi(argv[2]);
        const int64_t N = atoll(argv[3]), K = atoll(argv[4]), bytes = N * ((K + 31) / 32) * (type == 3 ? 20 : 34);
        float *w = read_exactly(N * K * sizeof(float));
        uint8_t *file = malloc(bytes);
        blocks_quantize(type, w, N, K, file, 2);
        fwrite(file, 1, bytes, stdout);
        fprintf(stderr, "%s\n", kernel_path());
        return 0;
    }
    if (argc == 8 && !strcmp(argv[1], "attention")) {
        const int64_t H = atoll(argv[2]), Hkv = atoll(argv[3]), T = atoll(argv[4]), D = atoll(argv[5]);
        const int64_t start = atoll(argv[6]), window = atoll(argv[7]), S = start + T;
        float *q = read_exactly(H * T * D * sizeof(float));
        float *keys = read_exactly(Hkv * S * D * sizeof(float)), *values = read_exactly(Hkv * S * D * sizeof(float));
        float *out = malloc(H * T * D * sizeof(float)), *scratch = malloc(H * T * S * sizeof(float));
        float *one_q = malloc(H * D * sizeof(float)), *one_out = malloc(H * D * sizeof(float));
        const float scale = 1.0f / sqrtf((float)D);
        rowwise_attention_f32(q, keys, values, out, scratch, H, Hkv, T, D, S * D, start, window, scale, 2);
        write_floats(out, H * T * D);
        for (int64_t t = 0; t < T; t++) {  /* each position alone, on one thread */
            for (int64_t h = 0; h < H; h++) memcpy(one_q + h * D, q + (h * T + t) * D, D * sizeof(float));
            rowwise_attention_f32(one_q, keys, values, one_out, scratch, H, Hkv, 1, D, S * D, start + t, window,
                                  scale, 1);
            for (int64_t h = 0; h < H; h++) write_floats(one_out + h * D, D);  /* (H, D) for position t */
        }
        return 0;
    }
    if (argc == 7 && !strcmp(argv[1], "tree")) {
        const int64_t H = atoll(argv[2]), Hkv = atoll(argv[3]), T = atoll(argv[4]), D = atoll(argv[5]);
        const int64_t start = atoll(argv[6]), S = start + T;
        float *q = read_exactly(H * T * D * sizeof(float));
        float *keys = read_exactly(Hkv * S * D * sizeof(float)), *values = read_exactly(Hkv * S * D * sizeof(float));
        int64_t *parents = read_exactly(T * sizeof(int64_t));
        float *out = malloc(H * T * D * sizeof(float)), *scratch = malloc(H * T * S * sizeof(float));
        attention_share(q, keys, values, out, scratch, H, Hkv, T, D, S * D, start, 0, 1.0f / sqrtf((float)D), parents,
                        NULL, 0, 1);
        write_floats(out, H * T * D);
        return 0;
    }
    if (argc == 7 && !strcmp(argv[1], "regions")) {
        const int64_t H = atoll(argv[2]), Hkv = atoll(argv[3]), T = atoll(argv[4]), D = atoll(argv[5]);
        const int64_t span = atoll(argv[6]);
        float *q = read_exactly(H * T * D * sizeof(float));
        float *keys = read_exactly(Hkv * span * D * sizeof(float));
        float *values = read_exactly(Hkv * span * D * sizeof(float));
        int64_t *slots = read_exactly(T * sizeof(int64_t)), *firsts = read_exactly(T * sizeof(int64_t));
        float *out = malloc(H * T * D * sizeof(float)), *scratch = malloc(H * T * span * sizeof(float));
        const float scale = 1.0f / sqrtf((float)D);
        const RowSlots rows = {slots, firsts};
        attention_share(q, keys, values, out, scratch, H, Hkv, T, D, span * D, span - T, 0, scale, NULL, &rows, 0, 1);
        write_floats(out, H * T * D);
        float *one_q = malloc(H * D * sizeof(float)), *one_out = malloc(H * D * sizeof(float));
        for (int64_t t = 0; t < T; t++) {  /* each row alone: (H, 1, D) */
            for (int64_t h = 0; h < H; h++) memcpy(one_q + h * D, q + (h * T + t) * D, D * sizeof(float));
            const RowSlots one = {slots + t, firsts + t};
            attention_share(one_q, keys, values, one_out, scratch, H, Hkv, 1, D, span * D, slots[t], 0, scale, NULL,
                            &one, 0, 1);
            for (int64_t h = 0; h < H; h++) memcpy(out + (h * T + t) * D, one_out + h * D, D * sizeof(float));
        }
        write_floats(out, H * T * D);
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "hierarchical")) {
        const int64_t T = atoll(argv[2]), Hkv = atoll(argv[3]), D = atoll(argv[4]), slots = Hkv * T;
        float *keys = read_exactly(T * Hkv * D * sizeof(float)), *values = read_exactly(T * Hkv * D * sizeof(float));
        HierarchicalCache cache = {0};
        HierarchicalPlanes *stores[2] = {&cache.keys, &cache.values};
        for (int i = 0; i < 2; i++) {
            stores[i]->upper = calloc(slots * D / 2, 1);
            stores[i]->lower = calloc(slots * D / 2, 1);
            stores[i]->step = calloc(slots, 2);
            stores[i]->low = calloc(slots, 2);
        }
        hierarchical_store(&cache, 0, keys, values, Hkv * D, T, 0, Hkv, D, T);
        for (int i = 0; i < 2; i++) {
            fwrite(stores[i]->upper, 1, slots * D / 2, stdout);
            fwrite(stores[i]->lower, 1, slots * D / 2, stdout);
            fwrite(stores[i]->step, 2, slots, stdout);
            fwrite(stores[i]->low, 2, slots, stdout);
        }
        float *read_keys = malloc(slots * D * sizeof(float)), *read_values = malloc(slots * D * sizeof(float));
        for (int draft = 0; draft < 2; draft++) {
            cache.draft = draft;
            hierarchical_load_share(&cache, 0, read_keys, read_values, T, Hkv, D, T, 0, 1);
            write_floats(read_keys, slots * D);
        }
        return 0;
    }
    fprintf(stderr, "usage: kernel_driver matmul FORMAT M N K BIAS | blocks TYPE M N K | quantize TYPE N K | "
                    "attention H HKV T D START WINDOW | tree H HKV T D START | regions H HKV T D SPAN | "
                    "hierarchical T HKV D\n");
    return 2;
}
