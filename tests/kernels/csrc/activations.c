/* simd.h's element-wise activations from the command line, to compare the CPU paths with each other: built with each
 * path's flags, natively and for aarch64 under qemu-user (tests/kernels/test_activations.py).
 *
 *   activations COUNT < gate (COUNT f32), up (COUNT f32) > silu(gate) * up, gelu_tanh(gate) * up and
 *               30 tanh(gate / 30) (COUNT f32 each), then the same three computed in spans of 5 elements
 *
 * Prints the path's name to stderr.
 */
#include <stdio.h>
#include <stdlib.h>

#include "simd.h"  /* edge/kernels/csrc: the helpers the kernels use, as each path compiles them */

#define SPAN 5

static void activations(const float *gate, const float *up, float *out, int64_t count, int64_t span) {
    for (int64_t first = 0; first < count; first += span) {
        const int64_t n = count - first < span ? count - first : span;
        gated_span(gate + first, up + first, out + first, n, ACTIVATION_SILU);
        gated_span(gate + first, up + first, out + count + first, n, ACTIVATION_GELU_TANH);
        memcpy(out + 2 * count + first, gate + first, n * sizeof(float));
        softcap_span(out + 2 * count + first, n, 30.0f);
    }
}

int main(int argc, char **argv) {
    fprintf(stderr, "%s\n", EDGE_PATH);
    if (argc != 2) {
        fprintf(stderr, "usage: activations COUNT < gate, up (COUNT float32 each)\n");
        return 2;
    }
    const int64_t count = atoll(argv[1]);
    float *in = malloc(2 * count * sizeof(float)), *out = malloc(3 * count * sizeof(float));
    if (fread(in, sizeof(float), 2 * count, stdin) != (size_t)(2 * count)) {
        fprintf(stderr, "activations: short input\n");
        return 2;
    }
    activations(in, in + count, out, count, count);
    fwrite(out, sizeof(float), 3 * count, stdout);
    activations(in, in + count, out, count, SPAN);
    fwrite(out, sizeof(float), 3 * count, stdout);
    return 0;
}
