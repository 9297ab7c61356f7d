/* Batch-invariant small-batch matmul for CPU decoding: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]).
 *
 * Every output element is one dot product computed in the same order whatever the number of rows M, the row's
 * index or the thread count: two 16-lane partial sums over k in order, a k % 32 tail, then a fixed pairwise
 * reduction. So a (k + 1)-row verify pass produces bit for bit the rows that k + 1 single-row decode steps
 * produce, which makes greedy speculative decoding exactly equal to plain decoding (vendor BLAS picks different
 * kernels for 1 and for 5 rows, and they round differently).
 *
 * Blocks of weight rows are the outer loop and up to BLOCK_ROWS input rows are interleaved inside: each weight row is
 * read from memory once and used for all M inputs, so a 5-row verify pass costs little more than a 1-row decode
 * step (decoding is bound by weight reads). Interleaving changes nothing in any one dot product's order of
 * operations.
 * Weights are float32, bfloat16 or float16 (16-bit ones widened exactly in registers); inputs and outputs are float32.
 *
 * The build passes -ffp-contract=off, so the compiler never fuses (or declines to fuse) a multiply and an add on its
 * own, which it could do differently in the 4-row loop and the 1-row loop. Fusion is explicit instead: the dot
 * products use FMA intrinsics where the CPU has them (multiply_add) and the attention uses fmaf(), the same
 * instruction for every row count.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A block: BLOCK_COLS weight rows against up to BLOCK_ROWS input rows, 2 * BLOCK_ROWS * BLOCK_COLS accumulators in
 * registers (20 of AVX-512's 32; AVX2 holds a 16-lane vector in two of its 16 registers, so it takes fewer rows).
 * The weight rows of a block are read side by side, a pattern this CPU's hardware prefetcher follows at about half
 * the speed of one sequential stream; so each block prefetches the next one in address order as it goes (a prefetch
 * past the end of the matrix does not fault), and a single input row reads the weight rows one after another. */
#define BLOCK_COLS 2
#if defined(__AVX512F__)
#define BLOCK_ROWS 5
#else
#define BLOCK_ROWS 2
#endif

/* 16 floats in one vector (one AVX-512 register, two AVX2 registers); accumulators stay in registers. */
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef float v2 __attribute__((vector_size(8)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

static inline v16 load_f32(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v16 load_bf16(const uint16_t *p) {
    u16x16 half;
    memcpy(&half, p, sizeof half);
    u32x16 wide = __builtin_convertvector(half, u32x16) << 16;  /* bfloat16 bits are the top of a float32 */
    v16 v;
    memcpy(&v, &wide, sizeof v);
    return v;
}

/* float16 -> float32 is exact: the hardware conversion where the CPU has it (AVX-512F / F16C), else bit arithmetic */
static inline float f16_to_f32(uint16_t bits) {
#if defined(__F16C__)
    return _cvtsh_ss(bits);
#else
    const uint32_t sign = (uint32_t)(bits & 0x8000) << 16, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
    uint32_t wide;
    if (exponent == 0x1f) {
        wide = sign | 0x7f800000u | (mantissa << 13);  /* inf, nan */
    } else if (exponent != 0) {
        wide = sign | ((exponent + 112) << 23) | (mantissa << 13);  /* normal: rebias 15 -> 127 */
    } else if (mantissa == 0) {
        wide = sign;  /* zero */
    } else {  /* subnormal: mantissa * 2^-24, exact in float32 */
        float value = (float)mantissa * 0x1p-24f;
        memcpy(&wide, &value, sizeof wide);
        wide |= sign;
    }
    float out;
    memcpy(&out, &wide, sizeof out);
    return out;
#endif
}

static inline v16 load_f16(const uint16_t *p) {
#if defined(__AVX512F__)
    return (v16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__F16C__)
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
    v16 out;
    memcpy(&out, &lo, 32);
    memcpy((float *)&out + 8, &hi, 32);
    return out;
#else
    v16 out;
    for (int i = 0; i < 16; i++) out[i] = f16_to_f32(p[i]);
    return out;
#endif
}

static inline float scalar_f16(const uint16_t *p) { return f16_to_f32(*p); }

static inline float bf16_to_f32(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

static inline float scalar_f32(const float *p) { return *p; }
static inline float scalar_bf16(const uint16_t *p) { return bf16_to_f32(*p); }

/* The fixed reduction of 16 lanes: a pairwise tree (upper half added onto lower half: 8, 4, 2, 1 lanes), in
 * registers. */
static inline float reduce_lanes(v16 sum) {
    v8 s8 = __builtin_shufflevector(sum, sum, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(sum, sum, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
    v2 s2 = __builtin_shufflevector(s4, s4, 0, 1) + __builtin_shufflevector(s4, s4, 2, 3);
    return s2[0] + s2[1];
}

/* Two 16-lane partial sums added lane-wise, then the tree. */
static inline float reduce(v16 a, v16 b) { return reduce_lanes(a + b); }

/* acc + a * b, fused into one rounding where the CPU has FMA (the same instruction for every row count). */
static inline v16 multiply_add(v16 acc, v16 a, v16 b) {
#if defined(__AVX512F__)
    return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#elif defined(__FMA__)
    __m256 lo = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)&a), _mm256_loadu_ps((const float *)&b),
                                _mm256_loadu_ps((const float *)&acc));
    __m256 hi = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)&a + 8), _mm256_loadu_ps((const float *)&b + 8),
                                _mm256_loadu_ps((const float *)&acc + 8));
    v16 out;
    memcpy(&out, &lo, 32);
    memcpy((float *)&out + 8, &hi, 32);
    return out;
#else
    return acc + a * b;
#endif
}

/* One block of outputs: R input rows (x + r * K) against G weight rows (w + (n0 + g) * K), R and G compile-time
 * constants. Each output is one dot product: two 16-lane partial sums over k in steps of 32 (multiply_add), a scalar
 * tail for k % 32, the fixed reduction, then + tail + bias -- the same operations in the same order for any R, G,
 * row index or thread. Per 32 k: 2G weight loads and 2R input loads feed 2RG multiply-adds, so a 5-row verify pass
 * is bound by the multiply-adds rather than by loads. */
#define DEFINE_BLOCK(NAME, WTYPE, LOADV, LOADS)                                                                  \
    static inline __attribute__((always_inline)) void NAME(const float *x, const WTYPE *w, const float *bias,    \
                                                           float *y, int64_t n0, int64_t N, int64_t K, const int R, \
                                                           const int G) {                                        \
        v16 even[BLOCK_ROWS][BLOCK_COLS], odd[BLOCK_ROWS][BLOCK_COLS];                                           \
        float tail[BLOCK_ROWS][BLOCK_COLS];                                                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                      \
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {                                                \
                even[r][g] = odd[r][g] = (v16){0};                                                               \
                tail[r][g] = 0.0f;                                                                               \
            }                                                                                                    \
        const WTYPE *rows = w + n0 * K;                                                                          \
        const char *next = (const char *)(rows + G * K); /* the next block, prefetched in address order */       \
        int64_t k = 0;                                                                                           \
        for (; k + 32 <= K; k += 32) {                                                                           \
            v16 w0[BLOCK_COLS], w1[BLOCK_COLS];                                                                  \
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {                                                \
                w0[g] = LOADV(rows + g * K + k);                                                                 \
                w1[g] = LOADV(rows + g * K + k + 16);                                                            \
                if (G > 1) {                                                                                     \
                    __builtin_prefetch(next + (k * G + g * 32) * (int64_t)sizeof(WTYPE));                        \
                    __builtin_prefetch(next + (k * G + g * 32 + 16) * (int64_t)sizeof(WTYPE));                   \
                }                                                                                                \
            }                                                                                                    \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                \
                const v16 x0 = load_f32(x + r * K + k), x1 = load_f32(x + r * K + k + 16);                       \
                _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {                                            \
                    even[r][g] = multiply_add(even[r][g], x0, w0[g]);                                            \
                    odd[r][g] = multiply_add(odd[r][g], x1, w1[g]);                                              \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (; k < K; k++)                                                                                       \
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {                                                \
                const float wk = LOADS(rows + g * K + k);                                                        \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) tail[r][g] += x[r * K + k] * wk;             \
            }                                                                                                    \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                      \
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++)                                                  \
                y[r * N + n0 + g] = (reduce(even[r][g], odd[r][g]) + tail[r][g]) + (bias ? bias[n0 + g] : 0.0f);  \
    }

DEFINE_BLOCK(block_f32, float, load_f32, scalar_f32)
DEFINE_BLOCK(block_bf16, uint16_t, load_bf16, scalar_bf16)
DEFINE_BLOCK(block_f16, uint16_t, load_f16, scalar_f16)

/* Columns in blocks of BLOCK_COLS weight rows (split between the threads), rows in groups of at most BLOCK_ROWS; the
 * last, narrower column block and row group use the same per-output operations. */
#define BLOCK_CASE(BLOCK, R)                                                                                     \
    case R:                                                                                                      \
        if (R == 1) /* one input row: the weight rows one after another, a single sequential stream */          \
            for (int g = 0; g < G; g++) BLOCK(x + m * K, w, bias, y + m * N, n0 + g, N, K, 1, 1);                 \
        else if (G == BLOCK_COLS) BLOCK(x + m * K, w, bias, y + m * N, n0, N, K, R, BLOCK_COLS);                \
        else BLOCK(x + m * K, w, bias, y + m * N, n0, N, K, R, 1);                                              \
        break;

#define DEFINE_MATMUL(NAME, WTYPE, BLOCK)                                                                       \
    void NAME(const float *x, const WTYPE *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,     \
              int threads) {                                                                                    \
        const int64_t blocks = (N + BLOCK_COLS - 1) / BLOCK_COLS;                                              \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                                      \
        for (int64_t b = 0; b < blocks; b++) {                                                                  \
            const int64_t n0 = b * BLOCK_COLS;                                                                  \
            const int G = N - n0 < BLOCK_COLS ? (int)(N - n0) : BLOCK_COLS;                                     \
            for (int64_t m = 0; m < M; m += BLOCK_ROWS) {                                                       \
                switch (M - m < BLOCK_ROWS ? M - m : BLOCK_ROWS) {                                              \
                    BLOCK_CASE(BLOCK, 1)                                                                        \
                    BLOCK_CASE(BLOCK, 2)                                                                        \
                    BLOCK_CASE(BLOCK, 3)                                                                        \
                    BLOCK_CASE(BLOCK, 4)                                                                        \
                    BLOCK_CASE(BLOCK, 5)                                                                        \
                    default: break;                                                                             \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    }

DEFINE_MATMUL(rowwise_matmul_f32, float, block_f32)
DEFINE_MATMUL(rowwise_matmul_bf16, uint16_t, block_bf16)
DEFINE_MATMUL(rowwise_matmul_f16, uint16_t, block_f16)

/* int8 weights, activations quantized per row (w8a8): y[m, n] = sx[m] * sw[n] * sum_k xq[m, k] * wq[n, k] (+ bias[n]).
 *
 * Weights are quantized per output channel (wq = round(w / sw), |wq| <= 127) and packed for VNNI's u8 x s8 dot
 * products: outputs in groups of 16, and within a group K/4 chunks of 64 bytes, chunk c holding wq[n, 4c .. 4c+3]
 * for the group's 16 outputs n in turn; so one vpdpbusd adds 4 products into each of 16 outputs' lanes (no
 * horizontal sums). After the N * K packed bytes come N float32 scales sw and N int32 corrections 128 * sum_k wq[n, k].
 * Each input row is quantized alone: sx = max |x| / 127, xq = round(x / sx) + 128 (unsigned for vpdpbusd; the
 * correction takes the 128 back out). Integer sums are exact in any order, and the float steps after them are fixed
 * per output, so each row's result is the same whatever the number of rows, their grouping or the threads: a verify
 * pass reproduces decode steps bit for bit, as the float kernels do. N must be a multiple of 16 and K of 4
 * (int8_supported in kernels/cpu_matmul.py). */
#define I8_GROUP 16
#define I8_TILE_GROUPS 4  /* output groups per tile: 64 outputs */
#define I8_TILE_ROWS 4

/* Row m of x (K floats) -> K unsigned bytes and its scale. Round-half-even, as both paths below do. */
static float quantize_row(const float *x, uint8_t *out, int64_t K) {
    float top = 0.0f;
    int64_t k = 0;
#if defined(__AVX512F__)
    __m512 tops = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) tops = _mm512_max_ps(tops, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
    top = _mm512_reduce_max_ps(tops);  /* a maximum: the same in any order */
#endif
    for (; k < K; k++) top = fabsf(x[k]) > top ? fabsf(x[k]) : top;
    if (top == 0.0f) {
        memset(out, 128, K);
        return 0.0f;
    }
    const float inverse = 127.0f / top;
    k = 0;
#if defined(__AVX512F__)  /* cvtps rounds half to even (the default mode), as nearbyintf does */
    const __m512 factor = _mm512_set1_ps(inverse), high = _mm512_set1_ps(127.0f), low = _mm512_set1_ps(-127.0f);
    for (; k + 16 <= K; k += 16) {
        const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(x + k), factor);
        const __m512 rounded = _mm512_roundscale_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 q = _mm512_min_ps(_mm512_max_ps(rounded, low), high);
        _mm_storeu_si128((__m128i *)(out + k),
                         _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(q), _mm512_set1_epi32(128))));
    }
#endif
    for (; k < K; k++) {
        float q = nearbyintf(x[k] * inverse);
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        out[k] = (uint8_t)((int)q + 128);
    }
    return top / 127.0f;
}

/* One tile: G groups of 16 outputs from group g0 against R rows, R and G compile-time constants. */
static inline __attribute__((always_inline)) void i8_tile(const uint8_t *xq, const float *sx, const int8_t *w,
                                                         const float *sw, const int32_t *correction,
                                                         const float *bias, float *y, int64_t g0, int64_t N,
                                                         int64_t K, const int R, const int G) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    __m512i acc[I8_TILE_ROWS][I8_TILE_GROUPS], acc2[I8_TILE_ROWS][I8_TILE_GROUPS];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) acc[r][g] = acc2[r][g] = _mm512_setzero_si512();
    const int8_t *rows[I8_TILE_GROUPS];
    _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) rows[g] = w + (g0 + g) * I8_GROUP * K;
    const int64_t chunks = K / 4;
    int64_t c = 0;
    for (; c + 2 <= chunks; c += 2) {  /* two chunks a step, into two sets of sums: independent chains for 1 row */
        __m512i w0[I8_TILE_GROUPS], w1[I8_TILE_GROUPS];
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {
            w0[g] = _mm512_loadu_si512((const void *)(rows[g] + c * 64));
            w1[g] = _mm512_loadu_si512((const void *)(rows[g] + c * 64 + 64));
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            int32_t pair[2];
            memcpy(pair, xq + r * K + c * 4, sizeof pair);
            const __m512i x0 = _mm512_set1_epi32(pair[0]), x1 = _mm512_set1_epi32(pair[1]);
            _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {
                acc[r][g] = _mm512_dpbusd_epi32(acc[r][g], x0, w0[g]);
                acc2[r][g] = _mm512_dpbusd_epi32(acc2[r][g], x1, w1[g]);
            }
        }
    }
    for (; c < chunks; c++)
        _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {
            const __m512i w0 = _mm512_loadu_si512((const void *)(rows[g] + c * 64));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                int32_t quad;
                memcpy(&quad, xq + r * K + c * 4, sizeof quad);
                acc[r][g] = _mm512_dpbusd_epi32(acc[r][g], _mm512_set1_epi32(quad), w0);
            }
        }
    /* the float steps of the scalar epilogue below, 16 outputs at a time: the same operations in the same order */
    _Pragma("GCC unroll 4") for (int g = 0; g < G; g++) {
        const int64_t n = (g0 + g) * I8_GROUP;
        const __m512i fix = _mm512_loadu_si512((const void *)(correction + n));
        const __m512 scale = _mm512_loadu_ps(sw + n), offset = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_add_epi32(acc[r][g], acc2[r][g]), fix));
            _mm512_storeu_ps(y + r * N + n,
                             _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dot, scale), _mm512_set1_ps(sx[r])), offset));
        }
    }
#else
    int32_t sums[I8_TILE_ROWS][I8_TILE_GROUPS][I8_GROUP];
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) {
            const int8_t *block = w + (g0 + g) * I8_GROUP * K;
            for (int lane = 0; lane < I8_GROUP; lane++) {
                int32_t sum = 0;
                for (int64_t k = 0; k < K; k++) sum += (int32_t)xq[r * K + k] * block[(k / 4) * 64 + lane * 4 + k % 4];
                sums[r][g][lane] = sum;
            }
        }
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            for (int lane = 0; lane < I8_GROUP; lane++) {
                const int64_t n = (g0 + g) * I8_GROUP + lane;
                const float dot = (float)(sums[r][g][lane] - correction[n]);
                y[r * N + n] = (dot * sw[n]) * sx[r] + (bias ? bias[n] : 0.0f);
            }
#endif
}

#define I8_CASE(R)                                                                                              \
    case R:                                                                                                     \
        switch (G) {                                                                                            \
            case 1: i8_tile(xq + m * K, sx + m, w, sw, correction, bias, y + m * N, g0, N, K, R, 1); break;      \
            case 2: i8_tile(xq + m * K, sx + m, w, sw, correction, bias, y + m * N, g0, N, K, R, 2); break;      \
            case 3: i8_tile(xq + m * K, sx + m, w, sw, correction, bias, y + m * N, g0, N, K, R, 3); break;      \
            default: i8_tile(xq + m * K, sx + m, w, sw, correction, bias, y + m * N, g0, N, K, R, 4); break;     \
        }                                                                                                       \
        break;

/* x (M, K) float32 -> y (M, N) float32 through packed int8 weights (layout above). */
void rowwise_matmul_i8(const float *x, const uint8_t *packed, const float *bias, float *y, int64_t M, int64_t N,
                       int64_t K, int threads) {
    const int8_t *w = (const int8_t *)packed;
    const float *sw = (const float *)(packed + N * K);
    const int32_t *correction = (const int32_t *)(packed + N * K + N * sizeof(float));
    uint8_t *xq = malloc(M * K + 64);
    float *sx = malloc(M * sizeof(float));
    if (xq == NULL || sx == NULL) abort();  /* a few KiB: out of memory here leaves nothing sensible to compute */
    for (int64_t m = 0; m < M; m++) sx[m] = quantize_row(x + m * K, xq + m * K, K);
    const int64_t groups = N / I8_GROUP, tiles = (groups + I8_TILE_GROUPS - 1) / I8_TILE_GROUPS;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t tile = 0; tile < tiles; tile++) {
        const int64_t g0 = tile * I8_TILE_GROUPS;
        const int G = groups - g0 < I8_TILE_GROUPS ? (int)(groups - g0) : I8_TILE_GROUPS;
        for (int64_t m = 0; m < M; m += I8_TILE_ROWS) {
            switch (M - m < I8_TILE_ROWS ? M - m : I8_TILE_ROWS) {
                I8_CASE(1)
                I8_CASE(2)
                I8_CASE(3)
                I8_CASE(4)
                default: break;
            }
        }
    }
    free(xq);
    free(sx);
}

/* Batch-invariant attention for a few queries at positions start .. start + T - 1 over a KV cache.
 *
 * q, out: (H, T, D) contiguous; keys, values: (Hkv, S_max, D) with row stride D and head stride kv_head_stride.
 * Query t sees keys [lo, start + t], lo = start + t - window + 1 when a sliding window is set (window > 0).
 * Each (head, query) is computed alone and in a fixed order (scores, max, exp and sum in key order, values
 * accumulated in key order), so its result does not depend on T or on the thread count. scratch holds
 * H * T * (start + T) floats for the scores.
 */
/* a . b: 16 lane-wise fused multiply-adds over d in order, a scalar tail, then the pairwise tree over the lanes.
 * With FMA hardware the lanes are one vector (multiply_add rounds once, as fmaf does, so both paths give the same
 * bits); without it, the scalar loop keeps fmaf's single rounding. */
static inline float dot_plain(const float *a, const float *b, int64_t D) {
    int64_t d = 0;
#if defined(__AVX512F__) || defined(__FMA__)
    v16 lanes = (v16){0};
    for (; d + 16 <= D; d += 16) lanes = multiply_add(lanes, load_f32(a + d), load_f32(b + d));
    float tail = 0.0f;
    for (; d < D; d++) tail = fmaf(a[d], b[d], tail);
    return reduce_lanes(lanes) + tail;
#else
    float acc[16] = {0};
    for (; d + 16 <= D; d += 16)
        for (int l = 0; l < 16; l++) acc[l] = fmaf(a[d + l], b[d + l], acc[l]);
    float tail = 0.0f;
    for (; d < D; d++) tail = fmaf(a[d], b[d], tail);
    for (int width = 8; width > 0; width /= 2)
        for (int l = 0; l < width; l++) acc[l] += acc[l + width];
    return acc[0] + tail;
#endif
}

/* result += weight * row over D floats, one fused multiply-add per element (vectorised where FMA exists). */
static inline void add_scaled(float *result, float weight, const float *row, int64_t D) {
    int64_t d = 0;
#if defined(__AVX512F__) || defined(__FMA__)
    const v16 scale = (v16){0} + weight;
    for (; d + 16 <= D; d += 16) {
        const v16 sum = multiply_add(load_f32(result + d), scale, load_f32(row + d));
        memcpy(result + d, &sum, sizeof sum);
    }
#endif
    for (; d < D; d++) result[d] = fmaf(weight, row[d], result[d]);
}

/* The 16 dot products of one query with 16 consecutive key rows (row stride D, D a multiple of 16), bit for bit
 * what dot_plain gives each: the same multiply-adds per key, then the same pairwise tree, run on 16 keys at once by
 * a transposing reduction (each level adds lane i + w onto lane i of every key, as reduce_lanes does for one). */
static inline v16 dot16(const float *query, const float *rows, int64_t D) {
    v16 lanes[16];
    for (int j = 0; j < 16; j++) {
        v16 sum = multiply_add((v16){0}, load_f32(query), load_f32(rows + j * D));
        for (int64_t d = 16; d < D; d += 16) sum = multiply_add(sum, load_f32(query + d), load_f32(rows + j * D + d));
        lanes[j] = sum;
    }
    v16 halves[8], quarters[4], eighths[2];
    for (int m = 0; m < 8; m++)  /* lanes 0-7: key 2m's upper half added onto its lower; 8-15: key 2m+1's */
        halves[m] = __builtin_shufflevector(lanes[2 * m], lanes[2 * m + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19,
                                            20, 21, 22, 23) +
                    __builtin_shufflevector(lanes[2 * m], lanes[2 * m + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26,
                                            27, 28, 29, 30, 31);
    for (int m = 0; m < 4; m++)  /* 4 lanes per key, keys 4m .. 4m+3 */
        quarters[m] = __builtin_shufflevector(halves[2 * m], halves[2 * m + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18,
                                              19, 24, 25, 26, 27) +
                      __builtin_shufflevector(halves[2 * m], halves[2 * m + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21,
                                              22, 23, 28, 29, 30, 31);
    for (int m = 0; m < 2; m++)  /* 2 lanes per key, keys 8m .. 8m+7 */
        eighths[m] = __builtin_shufflevector(quarters[2 * m], quarters[2 * m + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17,
                                             20, 21, 24, 25, 28, 29) +
                     __builtin_shufflevector(quarters[2 * m], quarters[2 * m + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19,
                                             22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(eighths[0], eighths[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                   30) +
           __builtin_shufflevector(eighths[0], eighths[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                   31) + (v16){0};  /* + 0: dot_plain's empty tail (turns -0 into +0 alike) */
}

/* exp(x) on 16 lanes for x <= 0 (scores minus their maximum): x = n ln2 + r with |r| <= ln2 / 2, e^r by the Cephes
 * single-precision polynomial (about 1 ulp), times 2^n through the exponent bits. x is clamped at -87 (e^-87 is
 * about 1.6e-38: no weight that small changes a float32 sum). The same operations on every lane and every call. */
static inline v16 exp_lanes(v16 x) {
    typedef int32_t i32x16 __attribute__((vector_size(64)));
    const v16 floor_x = (v16){0} - 87.0f;
    const i32x16 below = x < floor_x;  /* lane-wise: -1 where x is below the floor */
    i32x16 x_bits, floor_bits;
    memcpy(&x_bits, &x, sizeof x);
    memcpy(&floor_bits, &floor_x, sizeof floor_x);
    x_bits = (x_bits & ~below) | (floor_bits & below);
    memcpy(&x, &x_bits, sizeof x);
    const float magic = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits */
    const v16 shifted = x * 1.44269504088896341f + magic;
    const v16 n = shifted - magic;
    const v16 r = multiply_add(multiply_add(x, n, (v16){0} - 0.693359375f), n, (v16){0} + 2.12194440e-4f);
    v16 p = (v16){0} + 1.9875691500e-4f;
    p = multiply_add((v16){0} + 1.3981999507e-3f, p, r);
    p = multiply_add((v16){0} + 8.3334519073e-3f, p, r);
    p = multiply_add((v16){0} + 4.1665795894e-2f, p, r);
    p = multiply_add((v16){0} + 1.6666665459e-1f, p, r);
    p = multiply_add((v16){0} + 5.0000001201e-1f, p, r);
    const v16 e = multiply_add(r + 1.0f, p, r * r);  /* 1 + r + r^2 p */
    i32x16 shifted_bits;
    memcpy(&shifted_bits, &shifted, sizeof shifted);
    i32x16 scale_bits = (shifted_bits - 0x4B400000 + 127) << 23;  /* 2^n; 0x4B400000 is magic's bit pattern */
    v16 scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return e * scale;
}

/* Softmax weights of one query over keys [lo, hi]: scores[j] = exp(q . k_j * scale - max); returns their sum. Keys
 * go 16 at a time from lo (a zero-padded vector for the last few), and the sum is 16 lane-wise sums then the
 * pairwise tree, so each query's arithmetic depends only on its own range. */
static float query_scores(const float *query, const float *k, float *scores, int64_t lo, int64_t hi, int64_t D,
                          float scale) {
    int64_t j = lo;
    if (D % 16 == 0)
        for (; j + 16 <= hi + 1; j += 16) {
            const v16 block = dot16(query, k + j * D, D) * scale;
            memcpy(scores + j, &block, sizeof block);
        }
    for (; j <= hi; j++) scores[j] = dot_plain(query, k + j * D, D) * scale;
    float top = -INFINITY;
    for (j = lo; j <= hi; j++) top = scores[j] > top ? scores[j] : top;  /* a maximum: the same in any order */
    v16 sums = (v16){0};
    for (j = lo; j <= hi; j += 16) {
        const int64_t count = hi + 1 - j < 16 ? hi + 1 - j : 16;
        v16 block = (v16){0};
        memcpy(&block, scores + j, count * sizeof(float));
        block = exp_lanes(block - top);
        if (count < 16)
            for (int64_t lane = count; lane < 16; lane++) block[lane] = 0.0f;  /* padding adds nothing */
        memcpy(scores + j, &block, count * sizeof(float));
        sums += block;
    }
    return reduce_lanes(sums);
}

/* N queries' weighted sums of value rows over 16 * W columns from column c, in registers (N and W compile-time):
 * acc accumulates weight_j * v_j for j = lo[i] .. hi[i] in key order, one fused multiply-add each (add_scaled's
 * operations), then is stored. */
static inline __attribute__((always_inline)) void value_block(const float *const *weights, float *const *results,
                                                              const int64_t *lo, const int64_t *hi, int64_t first,
                                                              int64_t last, const float *v, int64_t D, int64_t c,
                                                              const int N, const int W) {
    v16 acc[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < N; i++)
        _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) acc[i][w] = (v16){0};
    for (int64_t j = first; j <= last; j++) {
        const float *row = v + j * D + c;
        v16 column[4];
        _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) column[w] = load_f32(row + 16 * w);
        _Pragma("GCC unroll 4") for (int i = 0; i < N; i++) {
            if (j < lo[i] || j > hi[i]) continue;
            const v16 scale = (v16){0} + weights[i][j];
            _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) acc[i][w] = multiply_add(acc[i][w], scale, column[w]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < N; i++)
        _Pragma("GCC unroll 4") for (int w = 0; w < W; w++) memcpy(results[i] + c + 16 * w, &acc[i][w], sizeof(v16));
}

#define VALUE_QUERIES 4
#define VALUE_CASE(N, W) \
    case N: value_block(weights, results, lo, hi, first, last, v, D, c, N, W); break;

/* Up to 4 queries' attention outputs from their softmax weights: value_block over 64 columns at a time, a scalar
 * loop for a D % 16 tail (fmaf, the same single rounding), then the division by each query's total. */
static void weighted_values(const float *const *weights, float *const *results, const int64_t *lo, const int64_t *hi,
                            const float *inverse, int n, const float *v, int64_t D) {
    int64_t first = lo[0], last = hi[0];
    for (int i = 1; i < n; i++) {
        if (lo[i] < first) first = lo[i];
        if (hi[i] > last) last = hi[i];
    }
    int64_t c = 0;
    for (; c + 64 <= D; c += 64)
        switch (n) { VALUE_CASE(1, 4) VALUE_CASE(2, 4) VALUE_CASE(3, 4) VALUE_CASE(4, 4) }
    for (; c + 16 <= D; c += 16)
        switch (n) { VALUE_CASE(1, 1) VALUE_CASE(2, 1) VALUE_CASE(3, 1) VALUE_CASE(4, 1) }
    for (int i = 0; i < n; i++) {
        for (int64_t d = c; d < D; d++) {
            float sum = 0.0f;
            for (int64_t j = lo[i]; j <= hi[i]; j++) sum = fmaf(weights[i][j], v[j * D + d], sum);
            results[i][d] = sum;
        }
        for (int64_t d = 0; d < D; d++) results[i][d] *= inverse[i];
    }
}

void rowwise_attention_f32(const float *q, const float *keys, const float *values, float *out, float *scratch,
                           int64_t H, int64_t Hkv, int64_t T, int64_t D, int64_t kv_head_stride, int64_t start,
                           int64_t window, float scale, int threads) {
    /* Work is split by KV head, so each key and value row is read for all the queries that share it (a GQA group's
     * heads, every row of a verify pass); a KV head's queries are split further when there are fewer KV heads than
     * threads. Each query's arithmetic is the same however the queries are grouped. */
    const int64_t group = H / Hkv, span = start + T, per_head = group * T;
    int64_t splits = (threads + Hkv - 1) / Hkv;
    if (splits > per_head) splits = per_head;
    if (splits < 1) splits = 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t unit = 0; unit < Hkv * splits; unit++) {
        const int64_t kv = unit / splits, part = unit % splits;
        const int64_t first = per_head * part / splits, end = per_head * (part + 1) / splits;
        const float *k = keys + kv * kv_head_stride, *v = values + kv * kv_head_stride;
        for (int64_t i0 = first; i0 < end; i0 += VALUE_QUERIES) {
            const float *weights[VALUE_QUERIES];
            float *results[VALUE_QUERIES], inverse[VALUE_QUERIES];
            int64_t lo[VALUE_QUERIES], hi[VALUE_QUERIES];
            const int n = end - i0 < VALUE_QUERIES ? (int)(end - i0) : VALUE_QUERIES;
            for (int i = 0; i < n; i++) {
                const int64_t ht = kv * per_head + i0 + i, t = ht % T, position = start + t;  /* head ht / T */
                lo[i] = (window > 0 && position - window + 1 > 0) ? position - window + 1 : 0;
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

/* One decoder layer for a few rows (a decode step or a verify pass), fused: the same row-by-row operations as the
 * dots and the attention above, so each row's result still does not depend on how many rows share the call.
 *
 *   x (T, D) in place: x += o(attention(rope(qkv(rmsnorm(x))))); x += down(silu(gate) * up)(rmsnorm(x))
 *
 * Keys/values of the T rows are written into the layer's cache (Hkv, S_max, Dh) at [start, start + T) before the
 * attention reads [0, start + t] for row t. cos/sin (T, Dh) are the rotary tables of the rows' positions. Optional
 * tensors are NULL when absent. scratch holds T * (D + Q + 2KV + 2Q + 2I) + H * T * (start + T) floats. */
/* The weights' format: matrices and norms alike (biases are float32); with WEIGHTS_I8 the matrices are packed int8
 * (rowwise_matmul_i8) and the norms float32. */
enum { WEIGHTS_F32 = 0, WEIGHTS_BF16 = 1, WEIGHTS_F16 = 2, WEIGHTS_I8 = 3 };

static inline float weight_at(const void *w, int64_t i, int format) {
    if (format == WEIGHTS_BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (format == WEIGHTS_F16) return f16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

static void matmul_rows(const float *x, const void *w, const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                        int format, int threads) {
    if (format == WEIGHTS_BF16)
        rowwise_matmul_bf16(x, (const uint16_t *)w, bias, y, M, N, K, threads);
    else if (format == WEIGHTS_F16)
        rowwise_matmul_f16(x, (const uint16_t *)w, bias, y, M, N, K, threads);
    else if (format == WEIGHTS_I8)
        rowwise_matmul_i8(x, (const uint8_t *)w, bias, y, M, N, K, threads);
    else
        rowwise_matmul_f32(x, (const float *)w, bias, y, M, N, K, threads);
}

static void rms_norm_rows(const float *x, const void *w, float *out, int64_t T, int64_t D, float eps, int format) {
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * D;
        float sum = 0.0f;
        for (int64_t d = 0; d < D; d++) sum = fmaf(row[d], row[d], sum);
        const float inverse = 1.0f / sqrtf(sum / (float)D + eps);
        for (int64_t d = 0; d < D; d++) out[t * D + d] = weight_at(w, d, format) * (row[d] * inverse);
    }
}

/* The model's final RMSNorm over T rows (a decode step or verify pass after fused_layers_f32): one call instead of
 * a handful of small torch ops. Each row alone, as in the layers. */
void rms_norm_f32(const float *x, const void *w, float *out, int64_t T, int64_t D, float eps, int format) {
    rms_norm_rows(x, w, out, T, D, eps, format);
}

static void rope_rows(float *v, const float *cos_t, const float *sin_t, int64_t heads, int64_t Dh) {
    const int64_t half = Dh / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *x = v + h * Dh;
        float rotated[512];
        for (int64_t d = 0; d < half; d++) {
            rotated[d] = -x[d + half];
            rotated[d + half] = x[d];
        }
        for (int64_t d = 0; d < Dh; d++) x[d] = x[d] * cos_t[d] + rotated[d] * sin_t[d];
    }
}

void fused_layer_f32(float *x, int64_t T, int64_t D, int64_t H, int64_t Hkv, int64_t Dh, int64_t I,
                     const void *attn_norm, const void *wqkv, const float *qkv_bias, const void *q_norm,
                     const void *k_norm, const void *wo, const float *o_bias, const void *ffn_norm,
                     const void *w_gate_up, const float *gate_up_bias, const void *w_down, const float *down_bias,
                     const float *cos_table, const float *sin_table, float *keys, float *values, int64_t S_max,
                     int64_t start, int64_t window, float eps, float scale, float *scratch, int format, int threads) {
    const int64_t Q = H * Dh, KV = Hkv * Dh, N = Q + 2 * KV;
    float *normed = scratch;                /* (T, D) */
    float *qkv = normed + T * D;            /* (T, N) */
    float *attended = qkv + T * N;          /* (T, Q) as (H, T, Dh) blocks below */
    float *q_heads = attended + T * Q;      /* (H, T, Dh) */
    float *gate_up = q_heads + T * Q;       /* (T, 2I) */
    float *scores = gate_up + T * 2 * I;    /* H * T * (start + T) */

    rms_norm_rows(x, attn_norm, normed, T, D, eps, format);
    matmul_rows(normed, wqkv, qkv_bias, qkv, T, N, D, format, threads);
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * N;           /* q (H, Dh) | k (Hkv, Dh) | v (Hkv, Dh) */
        if (q_norm) {
            for (int64_t h = 0; h < H; h++) rms_norm_rows(row + h * Dh, q_norm, row + h * Dh, 1, Dh, eps, format);
            for (int64_t h = 0; h < Hkv; h++)
                rms_norm_rows(row + Q + h * Dh, k_norm, row + Q + h * Dh, 1, Dh, eps, format);
        }
        rope_rows(row, cos_table + t * Dh, sin_table + t * Dh, H, Dh);
        rope_rows(row + Q, cos_table + t * Dh, sin_table + t * Dh, Hkv, Dh);
        for (int64_t h = 0; h < Hkv; h++) {
            memcpy(keys + (h * S_max + start + t) * Dh, row + Q + h * Dh, Dh * sizeof(float));
            memcpy(values + (h * S_max + start + t) * Dh, row + Q + KV + h * Dh, Dh * sizeof(float));
        }
        for (int64_t h = 0; h < H; h++) memcpy(q_heads + (h * T + t) * Dh, row + h * Dh, Dh * sizeof(float));
    }
    rowwise_attention_f32(q_heads, keys, values, attended, scores, H, Hkv, T, Dh, S_max * Dh, start, window, scale,
                          threads);
    for (int64_t t = 0; t < T; t++)        /* (H, T, Dh) -> (T, H*Dh), reusing qkv as the row buffer */
        for (int64_t h = 0; h < H; h++) memcpy(qkv + t * Q + h * Dh, attended + (h * T + t) * Dh, Dh * sizeof(float));
    matmul_rows(qkv, wo, o_bias, normed, T, D, Q, format, threads);
    for (int64_t i = 0; i < T * D; i++) x[i] += normed[i];

    rms_norm_rows(x, ffn_norm, normed, T, D, eps, format);
    matmul_rows(normed, w_gate_up, gate_up_bias, gate_up, T, 2 * I, D, format, threads);
    for (int64_t t = 0; t < T; t++) {
        float *row = gate_up + t * 2 * I;
        for (int64_t i = 0; i < I; i++) {
            const float g = row[i];
            row[i] = g / (1.0f + expf(-g)) * row[I + i];  /* silu(gate) * up, into the first half */
        }
    }
    for (int64_t t = 0; t < T; t++)        /* compact the activations to (T, I) rows for the down projection */
        memmove(gate_up + t * I, gate_up + t * 2 * I, I * sizeof(float));
    matmul_rows(gate_up, w_down, down_bias, normed, T, D, I, format, threads);
    for (int64_t i = 0; i < T * D; i++) x[i] += normed[i];
}

/* Several decoder layers in one call (a decode step or verify pass through the model, or a self-draft's subset):
 * fused_layer_f32 for layer order[i], i = 0 .. count - 1, one after another on the same x. weights holds 12 pointers
 * per model layer in fused_layer_f32's order (attn_norm, wqkv, qkv_bias, q_norm, k_norm, wo, o_bias, ffn_norm,
 * w_gate_up, gate_up_bias, w_down, down_bias; NULL where absent); keys/values are the whole cache
 * (L, Hkv, S_max, Dh), layer l at + l * layer_stride; windows[l] is layer l's sliding window (0: none). The same
 * operations as calling fused_layer_f32 per layer, without a Python round trip between layers. */
void fused_layers_f32(float *x, int64_t T, int64_t D, int64_t H, int64_t Hkv, int64_t Dh, int64_t I,
                      const int64_t *order, int64_t count, const void *const *weights, const int64_t *windows,
                      const float *cos_table, const float *sin_table, float *keys, float *values, int64_t S_max,
                      int64_t layer_stride, int64_t start, float eps, float scale, float *scratch, int format,
                      int threads) {
    for (int64_t i = 0; i < count; i++) {
        const int64_t l = order[i];
        const void *const *w = weights + 12 * l;
        fused_layer_f32(x, T, D, H, Hkv, Dh, I, w[0], w[1], (const float *)w[2], w[3], w[4], w[5],
                        (const float *)w[6], w[7], w[8], (const float *)w[9], w[10], (const float *)w[11], cos_table,
                        sin_table, keys + l * layer_stride, values + l * layer_stride, S_max, start, windows[l], eps,
                        scale, scratch, format, threads);
    }
}

/* Greedy drafting, k tokens in one call: a draft model (embed -> layers -> norm -> head -> argmax) or a feature
 * drafter (fc(feature | embed) -> its layer -> norm -> head -> argmax, its normed output becoming the next row's
 * feature). The same per-row operations as the Python path's calls, without a Python round trip per token.
 *
 * The first step runs T0 rows at positions [start, start + T0): tokens[t] (and features[t] (T0, D) when fc is set);
 * each later step runs one row: the token just drafted (and the previous step's normed output). Keys/values are
 * written into the drafter's cache as the layers run. embed (V, D) is in embed_format and head (V, D) in head_format
 * (WEIGHTS_I8: packed, rowwise_matmul_i8), everything else of the drafter (layers, norm, fc (D, 2D)) in format.
 * cos/sin are whole tables: row p is position p. A trimmed head (VocabTrim) holds only some tokens' rows: head_ids
 * (V) names the token of each row (NULL: row v is token v). scratch holds T0 * (4D + 3Q + 2KV + 2I) + H * T0 * (start + T0 + k) + D + V floats. out[i] receives draft token i.
 * With stop_below > 0, drafting stops before a token (never the first) whose softmax probability is below it.
 * Returns how many tokens were drafted (k unless it stopped). */
int64_t draft_greedy_f32(const int64_t *tokens, const float *features, int64_t T0, int64_t D, int64_t H, int64_t Hkv,
                         int64_t Dh, int64_t I, const int64_t *order, int64_t count, const void *const *weights,
                         const int64_t *windows, const float *cos_table, const float *sin_table, float *keys,
                         float *values, int64_t S_max, int64_t layer_stride, int64_t start, float eps, float scale,
                         const void *norm_weight, const void *fc, int format, const void *embed, const void *head,
                         const int64_t *head_ids, int64_t V, int head_format, int embed_format, int64_t k,
                         float stop_below,
                         int64_t *out, float *scratch, int threads) {
    float *x = scratch;                     /* (T0, D) the rows being run */
    float *joined = x + T0 * D;             /* (T0, 2D) feature | embedding, the fc's input */
    float *normed = joined + 2 * T0 * D;    /* (D) the last row after the norm: the next feature */
    float *logits = normed + D;             /* (V) */
    float *layer_scratch = logits + V;
    int64_t T = T0, position = start;
    const int64_t *step_tokens = tokens;
    const float *step_features = features;
    for (int64_t i = 0; i < k; i++) {
        for (int64_t t = 0; t < T; t++) {
            float *row = fc ? joined + t * 2 * D + D : x + t * D;
            for (int64_t d = 0; d < D; d++) row[d] = weight_at(embed, step_tokens[t] * D + d, embed_format);
            if (fc) memcpy(joined + t * 2 * D, step_features + t * D, D * sizeof(float));
        }
        if (fc) matmul_rows(joined, fc, NULL, x, T, D, 2 * D, format, threads);
        fused_layers_f32(x, T, D, H, Hkv, Dh, I, order, count, weights, windows, cos_table + position * Dh,
                         sin_table + position * Dh, keys, values, S_max, layer_stride, position, eps, scale,
                         layer_scratch, format, threads);
        rms_norm_rows(x + (T - 1) * D, norm_weight, normed, 1, D, eps, format);
        matmul_rows(normed, head, NULL, logits, 1, V, D, head_format, threads);
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;  /* the first of equal maxima, as torch.argmax */
        if (stop_below > 0.0f && i > 0) {
            double total = 0.0;  /* the best token's probability is 1 / sum(exp(logit - best logit)) */
            for (int64_t v = 0; v < V; v++) total += expf(logits[v] - logits[best]);
            if (1.0 / total < stop_below) return i;
        }
        out[i] = head_ids ? head_ids[best] : best;
        position += T;
        T = 1;
        step_tokens = out + i;
        step_features = normed;
    }
    return k;
}
