"""Triton kernels of the static decode step (edge/model/static_step.py): 16-bit activations, positions read from
device memory (so that a step can be captured once in a CUDA graph and replayed at any position), and every row
computed alone, in the same order whatever the number of rows, so a verify pass of k + 1 rows gives each row exactly
what a one-row step gives it.

    linear(x, weight, residual=None, glu=False)    x (M <= 16, K) 16-bit @ W.T (+ residual) -> (M, N) in x's dtype;
                                                   W dense 16-bit (N, K), or a QuantizedWeight (int4 / int8 groups)
    rms_norm(x, weight, eps)                       (M, D) rows normalized, as edge.model.transformer.RMSNorm
    rope_(qkv, cos, sin, position, heads)          rotary embedding of the q and k heads of a qkv buffer, in place
    append(qkv, cache_planes, position, ...)       keys/values of the rows stored at positions [P, P + M) of a cache
    attend(qkv, cache_planes, position, ...)       attention of the rows' queries over the cache, causal

Each matmul program reads BLOCK_N weight rows once for all (at most 16) rows of x and multiplies on the tensor cores
(tl.dot, float32 accumulation); the codes of int4 and int8 weights are exact in 16 bits, so each group's dot product
is exact before its float32 scale. A narrow long weight is split along its inputs by its shape alone. The attention
runs one program per KV head and chunk of positions, serving every query head of its group and every row at once,
and reads each cached vector once per step.
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache

import torch
import triton
import triton.language as tl

from edge.kernels.quant_weight import QuantizedWeight
from edge.kernels.triton_kernels import hierarchical_codes, int8_codes

MAX_ROWS = 16  # rows of x one call takes: a decode step, or a verify pass of up to 15 drafted tokens
DENSE, INT8, INT4 = 0, 1, 2
FLOAT_CACHE, INT8_CACHE, HIERARCHICAL, HIERARCHICAL_DRAFT = 3, 0, 1, 2  # (kinds as in triton_kernels' attention)


@lru_cache(maxsize=None)
def multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def _x_block(x_ptr, stride, m, m_ok, k, k_ok, K_HALF, GLU: tl.constexpr, NORM: tl.constexpr, inv, nw_ptr):
    """x rows m at inputs k as a (len(k), len(m)) block in float32; GLU: silu(x[:, k]) * x[:, K_HALF + k]; NORM:
    RMSNorm's output, x * inv (each row's 1 / rms) rounded to x's dtype, times the norm's weight."""
    mask = k_ok[:, None] & m_ok[None, :]
    a = tl.load(x_ptr + m[None, :] * stride + k[:, None], mask=mask, other=0.0)
    if NORM:
        normed = (a.to(tl.float32) * inv[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
        return normed * tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[:, None]
    a = a.to(tl.float32)
    if GLU:
        b = tl.load(x_ptr + m[None, :] * stride + K_HALF + k[:, None], mask=mask, other=0.0).to(tl.float32)
        a = a / (1.0 + tl.exp(-a)) * b
    return a


@triton.jit
def _codes(w_ptr, n, n_ok, k0, last, K, FORMAT: tl.constexpr, BLOCK_K: tl.constexpr, MAGIC: tl.constexpr,
           dtype: tl.constexpr):
    """The codes of weight rows n at inputs [k0, k0 + BLOCK_K) as exact 16-bit values, (BLOCK_N, BLOCK_K). MAGIC
    (float16): a code c, stored as the unsigned u = c + 8 (int4) or c + 128 (int8), is made as the float16 whose bits
    are 0x6400 | u, which is 1024 + u, minus 1024 + the offset: integer operations and one subtraction, no
    integer-to-float conversion. INT4 joins its low (input 2j) and high (2j + 1) nibbles into input order."""
    if FORMAT == 2:
        j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(w_ptr + n[:, None] * (K // 2) + j[None, :], mask=n_ok[:, None] & (2 * j < last)[None, :],
                         other=0x88)
        if MAGIC:
            low = ((packed & 15).to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True) - 1032.0
            high = ((packed >> 4).to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True) - 1032.0
        else:
            low = ((packed & 15).to(tl.int32) - 8).to(dtype)
            high = ((packed >> 4).to(tl.int32) - 8).to(dtype)
        return tl.reshape(tl.join(low.to(dtype), high.to(dtype)), (low.shape[0], BLOCK_K))
    k = k0 + tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=n_ok[:, None] & (k < last)[None, :], other=0)
    if FORMAT == 1 and MAGIC:
        unsigned = (w.to(tl.uint8, bitcast=True) ^ 0x80).to(tl.uint16)
        return ((unsigned | 0x6400).to(tl.float16, bitcast=True) - 1152.0).to(dtype)
    return w.to(dtype)


@triton.jit
def _last_split(count_ptr, splits):
    """Whether this program is the last of its tile's `splits` to arrive (its partial sums stored before: every
    thread's stores ordered before the count by the barrier and the count's release, the last program's reads of
    the others' after it by its acquire); the last one sets the count back to 0 for the next call."""
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == splits - 1
    if last:
        tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def _tile_product(w_ptr, s_ptr, n, n_ok, k0, last, K, GROUPS, xs, FORMAT: tl.constexpr, GROUP: tl.constexpr,
                  MAGIC: tl.constexpr, SCALE_CODES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  dtype: tl.constexpr):
    """Weight rows n at inputs [k0, k0 + BLOCK_K) times xs (BK, BM): (BN, BM) float32 (see _linear_kernel)."""
    w = _codes(w_ptr, n, n_ok, k0, last, K, FORMAT, BLOCK_K, MAGIC, dtype)  # (BN, BK)
    if FORMAT == 0:
        return tl.dot(w, xs)
    elif SCALE_CODES:
        g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        scale = tl.load(s_ptr + n[:, None] * GROUPS + g[None, :], mask=n_ok[:, None] & (g < GROUPS)[None, :],
                        other=0.0).to(dtype)  # (BN, BK / GROUP)
        w = tl.reshape(tl.reshape(w, (BLOCK_N, BLOCK_K // GROUP, GROUP)) * scale[:, :, None], (BLOCK_N, BLOCK_K))
        return tl.dot(w, xs)
    else:
        scale = tl.load(s_ptr + n * GROUPS + k0 // GROUP, mask=n_ok, other=0.0).to(tl.float32)  # (BN,)
        return tl.dot(w, xs) * scale[:, None]


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count: each row computed alike
def _linear_kernel(x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, nw_ptr, eps, M, N, K, X_STRIDE, GROUPS, K_PER_SPLIT,
                   partial_ptr, count_ptr, LAST_SUMS: tl.constexpr, FORMAT: tl.constexpr, GROUP: tl.constexpr,
                   GLU: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr,
                   SPLIT: tl.constexpr, MAGIC: tl.constexpr, SCALE_CODES: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, GLU_OUT: tl.constexpr = False):
    """Weight rows [BLOCK_N * i, ...) against every row of x, over inputs [split * K_PER_SPLIT, ...): acc (BLOCK_N,
    BLOCK_M) float32, BLOCK_K inputs a dot. DENSE: 16-bit weights. INT8/INT4 with BLOCK_K == GROUP: one group a
    dot of exact codes, scaled in float32 after; SCALE_CODES: several groups a dot, each code multiplied by its
    group's scale in 16 bits first (one rounding per weight, far fewer, longer dots). GLU_OUT: the weight holds 2N
    rows, gate then up; the program multiplies gate rows n and up rows N + n and writes silu(gate) * up (N of
    them), so the down projection reads its input as it is (no SwiGLU recomputed by each of its programs)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    n_ok = n < N
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    inv = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if NORM:  # each row's 1 / rms over all its K inputs, then the loop reads the normed rows
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + m[None, :] * X_STRIDE + k[:, None], mask=(k < K)[:, None] & m_ok[None, :],
                        other=0.0).to(tl.float32)
            squares += tl.sum(a * a, axis=0)
        inv = tl.math.rsqrt(squares / K + eps)
    first = split * K_PER_SPLIT
    last = tl.minimum(first + K_PER_SPLIT, K)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(first, last, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xs = _x_block(x_ptr, X_STRIDE, m, m_ok, k, k < last, K, GLU, NORM, inv, nw_ptr).to(dtype)  # (BK, BM)
        acc += _tile_product(w_ptr, s_ptr, n, n_ok, k0, last, K, GROUPS, xs, FORMAT, GROUP, MAGIC, SCALE_CODES,
                             BLOCK_N, BLOCK_K, dtype)
        if GLU_OUT:  # the up rows N + n against the same inputs
            acc_up += _tile_product(w_ptr, s_ptr, n + N, n_ok, k0, last, K, GROUPS, xs, FORMAT, GROUP, MAGIC,
                                    SCALE_CODES, BLOCK_N, BLOCK_K, dtype)
    if GLU_OUT:  # silu(gate) * up of the rounded products, as the unfused projection stores them
        gate = acc.to(dtype).to(tl.float32)
        acc = gate / (1.0 + tl.exp(-gate)) * acc_up.to(dtype).to(tl.float32)
    mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT:
        splits = tl.num_programs(1)
        tl.store(partial_ptr + (m[None, :] * splits + split) * N + n[:, None], acc, mask=mask)
        if LAST_SUMS:  # the tile's last split to finish adds the partial sums, in split order
            if _last_split(count_ptr + tl.program_id(0), splits):
                acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for other in range(0, splits):
                    acc += tl.load(partial_ptr + (m[None, :] * splits + other) * N + n[:, None], mask=mask,
                                   other=0.0, cache_modifier=".cg")
                if RESIDUAL:
                    acc += tl.load(res_ptr + m[None, :] * N + n[:, None], mask=mask, other=0.0).to(tl.float32)
                tl.store(out_ptr + m[None, :] * N + n[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        if RESIDUAL:
            acc += tl.load(res_ptr + m[None, :] * N + n[:, None], mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + m[None, :] * N + n[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _inverse_rms(row_ptr, K, eps, GROUP: tl.constexpr):
    """1 / rms of a row's K inputs (K a whole number of GROUPs), summed GROUP at a time in float32."""
    squares = tl.zeros((GROUP,), dtype=tl.float32)
    for k0 in range(0, K, GROUP):
        a = tl.load(row_ptr + k0 + tl.arange(0, GROUP)).to(tl.float32)
        squares += a * a
    return tl.math.rsqrt(tl.sum(squares, 0) / K + eps)


@triton.jit
def _gemv_rows_kernel(x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, nw_ptr, eps, N, K, X_STRIDE, GROUPS, K_PER_SPLIT,
                      FORMAT: tl.constexpr, GROUP: tl.constexpr, GLU: tl.constexpr, NORM: tl.constexpr,
                      RESIDUAL: tl.constexpr,
                      SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row m of x against weight rows [BLOCK_N * i, ...), one group of inputs at a time, on the CUDA cores: each
    thread unpacks whole groups of a weight row in registers (a code c stored as u = c + 8 or c + 128 becomes the
    float32 whose bits are 0x4B000000 | u, 2^23 + u, minus 2^23 + the offset: exact, no conversion instruction),
    multiplies by x in float32 and scales each group's sum by its float32 scale. Rows of x are programs of their
    own, all alike, so each row is computed alone whatever their number."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.program_id(2)
    n_ok = n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    inv = 0.0
    if NORM:  # the row's 1 / rms over all its K inputs
        inv = _inverse_rms(x_ptr + m * X_STRIDE, K, eps, GROUP)
    first = split * K_PER_SPLIT
    last = tl.minimum(first + K_PER_SPLIT, K)
    for k0 in range(first, last, GROUP):
        k = k0 + tl.arange(0, GROUP)
        xs = tl.load(x_ptr + m * X_STRIDE + k).to(tl.float32)  # (G,): whole groups, never past K
        if NORM:
            xs = (xs * inv).to(x_ptr.dtype.element_ty).to(tl.float32) * tl.load(nw_ptr + k).to(tl.float32)
            xs = xs.to(x_ptr.dtype.element_ty).to(tl.float32)
        if GLU:
            up = tl.load(x_ptr + m * X_STRIDE + K + k).to(tl.float32)
            xs = xs / (1.0 + tl.exp(-xs)) * up
        if FORMAT == 2:
            j = k0 // 2 + tl.arange(0, GROUP // 2)
            packed = tl.load(w_ptr + n[:, None] * (K // 2) + j[None, :], mask=n_ok[:, None], other=0x88)
            low = ((packed & 15).to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            high = ((packed >> 4).to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
            w = tl.reshape(tl.join(low, high), (BLOCK_N, GROUP))  # (BN, G), input order
        else:
            codes = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=n_ok[:, None], other=0)
            unsigned = (codes.to(tl.uint8, bitcast=True) ^ 0x80).to(tl.uint32)
            w = (unsigned | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
        scale = tl.load(s_ptr + n * GROUPS + k0 // GROUP, mask=n_ok, other=0.0).to(tl.float32)  # (BN,)
        acc += tl.sum(w * xs[None, :], axis=1) * scale
    if SPLIT:
        tl.store(out_ptr + (m * tl.num_programs(1) + split) * N + n, acc, mask=n_ok)
    else:
        if RESIDUAL:
            acc += tl.load(res_ptr + m * N + n, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * N + n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _word_codes(words, high, P: tl.constexpr, FORMAT: tl.constexpr, magic):
    """Code P of each 32-bit word (step_codes()'s layout) times 2^_code_shift(P), exact in float32. `words` and
    `high` (the words shifted right once, for the codes past the mantissa's 23 bits) come with the bits of 2^23 set
    (`magic`, 0x4B000000, an argument so that the compiler keeps one mask a code): one AND leaves the code's bits in
    place in the mantissa of 2^23, one subtraction removes 2^23 and the code's offset (8 or 128)."""
    shift: tl.constexpr = _code_shift(P, FORMAT)
    width: tl.constexpr = 15 if FORMAT == 2 else 255
    source = words if P < (5 if FORMAT == 2 else 2) else high
    bits = source & ((width << shift) | magic)
    return bits.to(tl.float32, bitcast=True) - (8388608.0 + (8.0 if FORMAT == 2 else 128.0) * (1 << shift))


@triton.constexpr_function
def _code_shift(p, fmt):
    """Where code p of a word lies in the mantissa once masked: int4 codes 0-4 where they are, 5-7 after a shift of
    12 bits (at 8, 12, 16); int8 codes 0-1 where they are, 2-3 after a shift of 16."""
    if fmt == 2:
        return 4 * p if p < 5 else 4 * (p - 3)
    return 8 * (p % 2)


@triton.jit
def _gemv_words_kernel(x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, nw_ptr, eps, N, K, X_STRIDE, GROUPS, K_PER_SPLIT,
                       W_STRIDE, magic, partial_ptr, count_ptr, LAST_SUMS: tl.constexpr, FORMAT: tl.constexpr,
                       GROUP: tl.constexpr, GLU: tl.constexpr, NORM: tl.constexpr,
                       RESIDUAL: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                       GLU_OUT: tl.constexpr = False):
    """Row m of x against weight rows [BLOCK_N * i, ...), BLOCK_G groups of inputs a step, on the CUDA cores, from
    32-bit words of codes (step_codes(): word w of a group holds the codes of its inputs w, w + W, w + 2W, ... with
    W the group's words, so the inputs that code P of consecutive words multiplies are consecutive). Each code is
    made by one mask in place and one float32 subtraction (_word_codes), multiplied by x in float32, and each group's
    sum scaled by its float32 scale. Rows of x are the fastest axis of the grid: the programs of one weight tile run
    side by side and read its codes from device memory once. W_STRIDE: a row's words (K / 8, K / 4), an argument
    of its own so that 16-byte loads are seen to be aligned. Every row is a program of its own, all alike, so each
    row is computed alone whatever their number. GLU_OUT: as _linear_kernel's (gate rows n, up rows N + n)."""
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    PER_WORD: tl.constexpr = 8 if FORMAT == 2 else 4
    WORDS: tl.constexpr = GROUP // PER_WORD
    n_ok = n < N
    dtype = x_ptr.dtype.element_ty
    inv = 0.0
    if NORM:  # the row's 1 / rms over all its K inputs
        inv = _inverse_rms(x_ptr + m * X_STRIDE, K, eps, GROUP)
    first = split * K_PER_SPLIT
    last = tl.minimum(first + K_PER_SPLIT, K)
    w = tl.arange(0, WORDS)
    acc = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    for k0 in range(first, last, BLOCK_G * GROUP):
        g = k0 // GROUP + tl.arange(0, BLOCK_G)  # (BG,)
        g_ok = g * GROUP < last
        word = g[:, None] * WORDS + w[None, :]  # (BG, W)
        mask = n_ok[:, None, None] & g_ok[None, :, None]
        words = tl.load(w_ptr + n[:, None, None] * W_STRIDE + word[None, :, :], mask=mask, other=0)  # (BN, BG, W)
        high = (words >> (12 if FORMAT == 2 else 16)) | magic
        words = words | magic
        part = tl.zeros((BLOCK_N, BLOCK_G, WORDS), dtype=tl.float32)  # (the first code's products replace it)
        part_up = tl.zeros((BLOCK_N, BLOCK_G, WORDS), dtype=tl.float32)
        if GLU_OUT:  # the up rows N + n
            words_up = tl.load(w_ptr + (n + N)[:, None, None] * W_STRIDE + word[None, :, :], mask=mask, other=0)
            high_up = (words_up >> (12 if FORMAT == 2 else 16)) | magic
            words_up = words_up | magic
        for p in tl.static_range(PER_WORD):
            k = g[:, None] * GROUP + p * WORDS + w[None, :]  # (BG, W): the inputs code p multiplies
            xs = tl.load(x_ptr + m * X_STRIDE + k, mask=g_ok[:, None], other=0.0).to(tl.float32)
            if NORM:
                xs = (xs * inv).to(dtype).to(tl.float32) * tl.load(nw_ptr + k, mask=g_ok[:, None],
                                                                   other=0.0).to(tl.float32)
                xs = xs.to(dtype).to(tl.float32)
            if GLU:
                up = tl.load(x_ptr + m * X_STRIDE + K + k, mask=g_ok[:, None], other=0.0).to(tl.float32)
                xs = xs / (1.0 + tl.exp(-xs)) * up
            if p != 0:  # exact: x times a power of two
                xs = xs * (1.0 / (1 << _code_shift(p, FORMAT)))
            codes = _word_codes(words, high, p, FORMAT, magic)
            if p == 0:
                part = codes * xs[None, :, :]
            else:
                part += codes * xs[None, :, :]
            if GLU_OUT:
                codes_up = _word_codes(words_up, high_up, p, FORMAT, magic)
                if p == 0:
                    part_up = codes_up * xs[None, :, :]
                else:
                    part_up += codes_up * xs[None, :, :]
        scale = tl.load(s_ptr + n[:, None] * GROUPS + g[None, :], mask=n_ok[:, None] & g_ok[None, :],
                        other=0.0).to(tl.float32)  # (BN, BG)
        acc += tl.sum(part, axis=2) * scale
        if GLU_OUT:
            scale_up = tl.load(s_ptr + (n + N)[:, None] * GROUPS + g[None, :], mask=n_ok[:, None] & g_ok[None, :],
                               other=0.0).to(tl.float32)
            acc_up += tl.sum(part_up, axis=2) * scale_up
    total = tl.sum(acc, axis=1)
    if GLU_OUT:  # silu(gate) * up of the rounded products, as the unfused projection stores them
        gate = total.to(dtype).to(tl.float32)
        total = gate / (1.0 + tl.exp(-gate)) * tl.sum(acc_up, axis=1).to(dtype).to(tl.float32)
    if SPLIT:
        splits = tl.num_programs(2)
        tl.store(partial_ptr + (m * splits + split) * N + n, total, mask=n_ok)
        if LAST_SUMS:  # the tile's last split to finish adds the partial sums, in split order
            if _last_split(count_ptr + m * tl.num_programs(1) + tl.program_id(1), splits):
                total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for other in range(0, splits):
                    total += tl.load(partial_ptr + (m * splits + other) * N + n, mask=n_ok, other=0.0,
                                     cache_modifier=".cg")
                if RESIDUAL:
                    total += tl.load(res_ptr + m * N + n, mask=n_ok, other=0.0).to(tl.float32)
                tl.store(out_ptr + m * N + n, total.to(out_ptr.dtype.element_ty), mask=n_ok)
    else:
        if RESIDUAL:
            total += tl.load(res_ptr + m * N + n, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * N + n, total.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _sum_splits_kernel(partial_ptr, res_ptr, out_ptr, N, SPLITS, RESIDUAL: tl.constexpr, BLOCK_S: tl.constexpr,
                       BLOCK: tl.constexpr):
    """out[m, n] = (residual +) the splits' partial sums, BLOCK_S splits a tile summed side by side, in out's
    dtype: one fixed order, whatever the number of rows."""
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s0 in range(0, SPLITS, BLOCK_S):
        split = s0 + tl.arange(0, BLOCK_S)
        tile = tl.load(partial_ptr + (m * SPLITS + split[:, None]) * N + n[None, :],
                       mask=(split < SPLITS)[:, None] & ok[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    if RESIDUAL:
        acc += tl.load(res_ptr + m * N + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * N + n, acc.to(out_ptr.dtype.element_ty), mask=ok)


# how quantized codes are multiplied by default (linear()'s `unpack`), int8 and int4: what timed fastest on an H200
# for one row, the word kernel for both (docs/benchmarks.md); EDGE_STEP_UNPACK picks one for both (benchmarks)
UNPACK = {8: 4, 4: 4}
if os.environ.get("EDGE_STEP_UNPACK"):
    UNPACK = dict.fromkeys(UNPACK, int(os.environ["EDGE_STEP_UNPACK"]))


def linear_tiles(weight: torch.Tensor | QuantizedWeight, device: torch.device, block_n: int | None = None,
                 unpack: int | None = None, block_k: int | None = None,
                 splits: int | None = None, glu_out: bool = False) -> tuple[int, int, int, int]:
    """(block_n, block_k, splits, inputs per split) of a weight: from its shape and format alone, never from the rows
    of x, so every row count adds each row's products in one order. `block_k` (inputs a step) and `splits` override
    the defaults (a benchmark's sweep); `glu_out` (linear()'s): half the rows are outputs, never split."""
    rows, columns = weight.shape
    if glu_out:
        rows, splits = rows // 2, 1
    quantized = isinstance(weight, QuantizedWeight)
    if unpack is None:
        unpack = UNPACK[weight.bits] if quantized else 1
    words = quantized and unpack == 4
    if words:  # whole groups, 128 bytes of codes of a weight row a step
        group = weight.group_size
        block_k = block_k or group * max(1, 1024 // (group * weight.bits))
    elif quantized and unpack in (0, 1, 3):
        block_k = weight.group_size
    else:
        group = weight.group_size if quantized else 16
        block_k = max(group, min(128, triton.next_power_of_2(columns)))
    rows_kernel = quantized and unpack in (3, 4)
    if words and weight.bits == 4 and rows >= 4096 and not glu_out:  # timed fastest on an H200; with glu_out (two
        block_n = block_n or 128  # tiles of codes) 128 rows spill registers
    block_n = block_n or (64 if rows_kernel or rows >= 4096 else 32)
    tiles = triton.cdiv(rows, block_n)
    processors = multiprocessors(device.index or 0) if device.type == "cuda" else 4
    blocks = triton.cdiv(columns, block_k)
    if splits is None:
        if words:  # 8 programs a multiprocessor, each split at least 4 steps long
            splits = max(1, min(triton.cdiv(8 * processors, tiles), blocks // 4))
        else:  # each split keeps 8 blocks of inputs
            splits = max(1, min(triton.cdiv(4 * processors, tiles), blocks // 8))
    per_split = triton.cdiv(blocks, max(1, min(splits, blocks))) * block_k
    return block_n, block_k, triton.cdiv(columns, per_split), per_split


def step_codes(weight: QuantizedWeight) -> torch.Tensor:
    """The codes of `weight` as _gemv_words_kernel reads them, made once and kept beside the weight: (N, K / 8)
    int32 words (int4) or (N, K / 4) (int8). In each group of a row, word w holds the unsigned codes (code + 8, code
    + 128) of the group's inputs w + P * W for P = 0, 1, ... (W: the group's words), code P in bits [P * b, P * b +
    b) (b = 4 or 8)."""
    held = getattr(weight, "_step_words", None)
    if held is not None and held.device == weight.codes.device:
        return held
    rows, columns = weight.shape
    group, bits = weight.group_size, weight.bits
    per_word = 32 // bits
    words = torch.empty((rows, columns // per_word), dtype=torch.int32, device=weight.codes.device)
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int64) * bits
    chunk = max(1, (1 << 22) // columns)  # rows at a time: a few tens of MB of temporaries
    for start in range(0, rows, chunk):
        part = dataclasses.replace(weight, codes=weight.codes[start:start + chunk],
                                   scales=weight.scales[start:start + chunk],
                                   shape=(min(chunk, rows - start), columns))
        unsigned = part.signed_codes().to(torch.int64) + (1 << (bits - 1))  # (n, K)
        unsigned = unsigned.view(-1, columns // group, per_word, group // per_word).transpose(2, 3)  # (n, G, W, P)
        packed = (unsigned << shifts).sum(-1)  # (n, G, W), < 2^32
        packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed)
        words[start:start + chunk] = packed.reshape(-1, columns // per_word).to(torch.int32)
    weight._step_words = words
    return words


def supports(weight: torch.Tensor | QuantizedWeight) -> bool:
    """Whether linear() takes this weight: dense 16-bit, or int8 (int4) in groups of a power of two >= 16 (32): a
    group is one dot of at least 16 inputs."""
    if isinstance(weight, QuantizedWeight):
        group = weight.group_size
        return group >= (32 if weight.bits == 4 else 16) and not group & (group - 1) and weight.shape[1] % group == 0
    return weight.dtype in (torch.float16, torch.bfloat16) and weight.dim() == 2


def linear(x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, residual: torch.Tensor | None = None,
           glu: bool = False, block_n: int | None = None, num_warps: int = 4, num_stages: int = 3,
           unpack: int | None = None, norm: tuple[torch.Tensor, float] | None = None, block_k: int | None = None,
           splits: int | None = None, glu_out: bool = False) -> torch.Tensor:
    """x (M, K) 16-bit, M <= 16 (glu: (M, 2K), the projection's input silu(x[:, :K]) * x[:, K:]) @ W.T (+ residual
    (M, N)) -> (M, N) in x's dtype. `block_n` overrides the tile's weight rows (a benchmark's sweep); `unpack`, how
    quantized codes are multiplied: 0 converted integers, one group a tensor-core dot; 1 (float16 activations) the
    same with the codes made by bit operations; 2 as 1, each code scaled in 16 bits, several groups a dot; 3 on the
    CUDA cores, a program per row of x (_gemv_rows_kernel); 4 on the CUDA cores from 32-bit words of codes packed
    once (step_codes(), _gemv_words_kernel). `norm` (weight, eps): the projection reads RMSNorm(x) (rms_norm()'s
    arithmetic), computed as it loads x. `block_k` (4: inputs a step, whole groups) and `splits` override the
    defaults of linear_tiles() (a benchmark's sweep). `glu_out`: W (2N, K) holds gate rows then up rows (a fused
    gate/up projection) -> silu(x @ Wg.T) * (x @ Wu.T) (M, N), each product rounded to x's dtype first: what the
    next projection's `glu` computes from this one's plain output, without each of its programs computing it."""
    rows, columns = weight.shape
    count = x.shape[0]
    if count > MAX_ROWS:
        raise ValueError(f"the step's matmul takes at most {MAX_ROWS} rows, got {count}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    fmt, codes, scales, group = DENSE, weight, weight, 1
    if isinstance(weight, QuantizedWeight):
        fmt = INT4 if weight.bits == 4 else INT8
        codes, scales, group = weight.codes, weight.scales, weight.group_size
    if unpack is None:
        unpack = UNPACK[weight.bits] if isinstance(weight, QuantizedWeight) else 1
    if glu_out:
        if residual is not None or glu:
            raise ValueError("glu_out takes no residual and no glu input")
        if fmt != DENSE and unpack in (2, 3):  # kernels without the paired epilogue: the plain output, then SwiGLU
            full = linear(x, weight, block_n=block_n, num_warps=num_warps, num_stages=num_stages, unpack=unpack,
                          norm=norm, block_k=block_k, splits=splits)
            half = rows // 2
            return (torch.nn.functional.silu(full[:, :half].float()) * full[:, half:].float()).to(x.dtype)
        rows //= 2
    if fmt != DENSE and unpack == 4 and norm is not None:
        # the normed rows first (one small kernel): in the word kernel each thread would norm every input it reads
        # for each of its weight rows' threads again
        x, norm = rms_norm(x, *norm), None
    block_n, block_k, splits, per_split = linear_tiles(weight, x.device, block_n, unpack, block_k, splits, glu_out)
    out = torch.empty((count, rows), dtype=x.dtype, device=x.device)
    res = residual if residual is not None else out
    groups = columns // group if fmt != DENSE else 1
    norm_weight, eps = norm if norm is not None else (out, 0.0)
    options = dict(FORMAT=fmt, GROUP=group, GLU=glu, NORM=norm is not None, RESIDUAL=residual is not None,
                   BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)
    if glu_out:
        options["GLU_OUT"] = True
    tiles = triton.cdiv(rows, block_n)
    rows_kernel = fmt != DENSE and unpack == 3
    counts = None if splits == 1 or rows_kernel else _split_counts(x.device, count * tiles)
    partial = out if splits == 1 else torch.empty((count, splits, rows), dtype=torch.float32, device=x.device)
    sums = dict(partial_ptr=partial, count_ptr=out if counts is None else counts, LAST_SUMS=counts is not None)
    if fmt != DENSE and unpack == 4:
        words = step_codes(weight)
        _gemv_words_kernel[(count, tiles, splits)](x, words, scales, res, out, norm_weight, eps, rows, columns,
                                                   x.stride(0), groups, per_split, words.stride(0), 0x4B000000,
                                                   SPLIT=splits > 1, BLOCK_G=block_k // group, **sums, **options)
    elif rows_kernel:
        _gemv_rows_kernel[(tiles, splits, count)](x, codes, scales, res, partial, norm_weight, eps, rows, columns,
                                                  x.stride(0), groups, per_split, SPLIT=splits > 1, **options)
    else:
        _linear_kernel[(tiles, splits)](x, codes, scales, res, out, norm_weight, eps, count, rows, columns,
                                        x.stride(0), groups, per_split, SPLIT=splits > 1, BLOCK_K=block_k,
                                        BLOCK_M=MAX_ROWS, MAGIC=unpack >= 1 and x.dtype == torch.float16,
                                        SCALE_CODES=fmt != DENSE and unpack == 2, **sums, **options)
    if splits > 1 and counts is None:  # the partial sums added by a kernel of their own
        _sum_splits_kernel[(count, triton.cdiv(rows, 128))](partial, res, out, rows, splits,
                                                            RESIDUAL=residual is not None, BLOCK_S=32, BLOCK=128)
    return out


# EDGE_STEP_LAST_SUMS=1: the last split of a tile adds the partial sums in the same kernel, in split order (one
# count per (row of x, weight tile), zeros between calls, made once per device before any graph capture). Off by
# default: on an H200 the serial tail of the last program timed slower than the separate kernel (0.5-3.6 us a
# call, docs/benchmarks.md)
_COUNTS: dict[torch.device, torch.Tensor] = {}
LAST_SUMS = os.environ.get("EDGE_STEP_LAST_SUMS", "0") == "1"


def _split_counts(device: torch.device, needed: int) -> torch.Tensor | None:
    if not LAST_SUMS:
        return None
    counts = _COUNTS.get(device)
    if counts is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # no allocation that outlives the graph's pool: the kernel of its own
        counts = _COUNTS[device] = torch.zeros(1 << 16, dtype=torch.int32, device=device)
    return counts if needed <= counts.numel() else None


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, BLOCK_D: tl.constexpr):
    """One row: weight * (x * rsqrt(mean(x^2) + eps)) rounded to x's dtype first, as the model's RMSNorm."""
    row = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(x_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32)
    normed = x * tl.math.rsqrt(tl.sum(x * x, 0) / D + eps)
    dtype = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + d, (normed.to(dtype).to(tl.float32) * w).to(dtype), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows, dims = x.shape
    out = torch.empty_like(x)
    _rms_norm_kernel[(rows,)](x.contiguous(), weight, out, dims, eps, BLOCK_D=triton.next_power_of_2(dims))
    return out


@triton.jit
def _rope_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, STRIDE, HALF: tl.constexpr):
    """Row t, head h (query heads then key heads): x * cos + rotate_half(x) * sin at position P + t, in place."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    position = tl.load(pos_ptr) + t
    i = tl.arange(0, HALF)
    base = qkv_ptr + t * STRIDE + h * 2 * HALF
    first = tl.load(base + i).to(tl.float32)
    second = tl.load(base + HALF + i).to(tl.float32)
    cos_a = tl.load(cos_ptr + position * 2 * HALF + i)
    sin_a = tl.load(sin_ptr + position * 2 * HALF + i)
    cos_b = tl.load(cos_ptr + position * 2 * HALF + HALF + i)
    sin_b = tl.load(sin_ptr + position * 2 * HALF + HALF + i)
    dtype = qkv_ptr.dtype.element_ty
    tl.store(base + i, (first * cos_a - second * sin_a).to(dtype))
    tl.store(base + HALF + i, (second * cos_b + first * sin_b).to(dtype))


def rope_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position: torch.Tensor, heads: int,
          head_dim: int) -> None:
    """Rotate the first `heads` heads (queries, then keys) of each row of qkv (M, ...) in place."""
    _rope_kernel[(qkv.shape[0], heads)](qkv, cos, sin, position, qkv.stride(0), HALF=head_dim // 2)


@triton.jit
def _rotated(ptr, rows_offset, idx, position, cos_ptr, sin_ptr, D: tl.constexpr, mask):
    """RoPE of the vectors at ptr + rows_offset (their elements idx) at `position`: x * cos + rotate_half(x) * sin,
    rounded to the vectors' dtype, in float32."""
    partner = (idx + D // 2) % D
    sign = tl.where(idx < D // 2, -1.0, 1.0)
    x = tl.load(ptr + rows_offset + idx, mask=mask, other=0.0).to(tl.float32)
    other = tl.load(ptr + rows_offset + partner, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + position * D + idx, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + position * D + idx, mask=mask, other=0.0)
    return (x * cos + sign * other * sin).to(ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _append_kernel(src_ptr, SRC_STRIDE, k_first, k_second, k_scale, k_low, v_first, v_second, v_scale, v_low,
                   pos_ptr, cos_ptr, sin_ptr, KV_SIZE, S_MAX, D: tl.constexpr, KIND: tl.constexpr,
                   ROPE: tl.constexpr):
    """Row t, KV head h, keys (0) or values (1): the vector quantized as edge.kernels.kv_quant.quantize does (int8
    or hierarchical) or stored as it is (FLOAT), at position P + t of the cache. ROPE: keys are rotated first."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    which = tl.program_id(2)
    position = tl.load(pos_ptr) + t
    slot = h * S_MAX + position
    src = src_ptr + t * SRC_STRIDE + which * KV_SIZE + h * D
    if ROPE:
        rotate = which == 0
    else:
        rotate = which < 0  # never
    if which == 0:
        first, second, scale_ptr, low_ptr = k_first, k_second, k_scale, k_low
    else:
        first, second, scale_ptr, low_ptr = v_first, v_second, v_scale, v_low
    pair = tl.arange(0, D // 2)
    if KIND == 3:
        d = tl.arange(0, D)
        if rotate:
            vector = _rotated(src, 0, d, position, cos_ptr, sin_ptr, D, d < D)
        else:
            vector = tl.load(src + d).to(tl.float32)
        tl.store(first + slot * D + d, vector.to(first.dtype.element_ty))
    else:
        if rotate:
            even = _rotated(src, 0, 2 * pair, position, cos_ptr, sin_ptr, D, pair < D)
            odd = _rotated(src, 0, 2 * pair + 1, position, cos_ptr, sin_ptr, D, pair < D)
        else:
            even = tl.load(src + 2 * pair).to(tl.float32)
            odd = tl.load(src + 2 * pair + 1).to(tl.float32)
        if KIND == 1:
            low, high = tl.minimum(tl.min(even, 0), tl.min(odd, 0)), tl.maximum(tl.max(even, 0), tl.max(odd, 0))
            upper, lower, step16, low16 = hierarchical_codes(even, odd, low, high)
            tl.store(first + slot * (D // 2) + pair, upper)
            tl.store(second + slot * (D // 2) + pair, lower)
            tl.store(scale_ptr + slot, step16.to(tl.float16))
            tl.store(low_ptr + slot, low16.to(tl.float16))
        else:
            top = tl.maximum(tl.max(tl.abs(even), 0), tl.max(tl.abs(odd), 0))
            c_even, c_odd, scale16 = int8_codes(even, odd, top)
            tl.store(first + slot * D + 2 * pair, c_even)
            tl.store(first + slot * D + 2 * pair + 1, c_odd)
            tl.store(scale_ptr + slot, scale16.to(tl.float16))


def append(kv: torch.Tensor, keys: tuple, values: tuple, position: torch.Tensor, kv_heads: int, head_dim: int,
           kind: int, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """kv (M, 2 * kv_heads * head_dim): each row's keys then values, stored at positions [P, P + M) of one layer's
    planes `keys`/`values` (first, second, scale, low; (Hkv, S_max, ...) each); `rope` (cos, sin (S, Dh) float32):
    the keys are rotated to their positions first."""
    rows = kv.shape[0]
    max_len = keys[0].shape[1]
    cos, sin = rope if rope is not None else (kv, kv)
    _append_kernel[(rows, kv_heads, 2)](kv, kv.stride(0), *keys, *values, position, cos, sin, kv_heads * head_dim,
                                        max_len, D=head_dim, KIND=kind, ROPE=rope is not None)


@triton.jit
def _load_block(first, second, scale_ptr, low_ptr, slots, ok, D: tl.constexpr, KIND: tl.constexpr):
    """Cached vectors at `slots` as a (len(slots), D) float32 block. KIND 0: int8; 1: hierarchical, 8 bits;
    2: hierarchical, upper 4 bits (the draft's view); 3: stored as they are (a 16-bit cache)."""
    d = tl.arange(0, D)
    mask = ok[:, None]
    if KIND == 3:
        return tl.load(first + slots[:, None] * D + d[None, :], mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + slots, mask=ok, other=0.0).to(tl.float32)[:, None]
    if KIND == 0:
        codes = tl.load(first + slots[:, None] * D + d[None, :], mask=mask, other=0).to(tl.float32)
        return codes * scale
    byte = slots[:, None] * (D // 2) + d[None, :] // 2
    shift = (d[None, :] % 2) * 4
    upper = (tl.load(first + byte, mask=mask, other=0).to(tl.int32) >> shift) & 15
    low = tl.load(low_ptr + slots, mask=ok, other=0.0).to(tl.float32)[:, None]
    if KIND == 2:
        return low + (upper.to(tl.float32) * 16.0 + 7.5) * scale
    lower = (tl.load(second + byte, mask=mask, other=0).to(tl.int32) >> shift) & 15
    return low + (upper * 16 + lower).to(tl.float32) * scale


@triton.jit(do_not_specialize=["T"])
def _attend_kernel(q_ptr, Q_STRIDE, k1, k2, k_scale, k_low, v1, v2, v_scale, v_low, pos_ptr, cos_ptr, sin_ptr,
                   best_ptr, total_ptr, acc_ptr, T, H, S_MAX, CHUNKS, sm_scale, GROUP: tl.constexpr, D: tl.constexpr,
                   KIND: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, QB: tl.constexpr,
                   ROPE: tl.constexpr):
    """KV head h, chunk c of positions, block b of query rows (row r: step t = r // GROUP, query head
    h * GROUP + r % GROUP): each row's online-softmax state over the positions of the chunk it sees ([0, P + t]).
    The chunk's keys and values are read once for the whole group."""
    kv = tl.program_id(0)
    c = tl.program_id(1)
    r = tl.program_id(2) * QB + tl.arange(0, QB)
    t = r // GROUP
    head = kv * GROUP + r % GROUP
    r_ok = t < T
    d = tl.arange(0, D)
    start = tl.load(pos_ptr)
    dtype = q_ptr.dtype.element_ty  # the dots' operands: 16 bits, on the tensor cores; float32 sums
    last = start + t  # the last position row r sees
    if ROPE:  # the queries rotated to their positions as they are read
        q = _rotated(q_ptr, t[:, None] * Q_STRIDE + head[:, None] * D, d[None, :], last[:, None], cos_ptr, sin_ptr,
                     D, r_ok[:, None]).to(dtype)
    else:
        q = tl.load(q_ptr + t[:, None] * Q_STRIDE + head[:, None] * D + d[None, :], mask=r_ok[:, None], other=0.0)
    best = tl.full((QB,), -1e30, tl.float32)
    total = tl.zeros((QB,), tl.float32)
    acc = tl.zeros((QB, D), tl.float32)
    end = tl.minimum(start + T, (c + 1) * CHUNK)
    for s0 in range(c * CHUNK, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = s < end
        keys = _load_block(k1, k2, k_scale, k_low, kv * S_MAX + s, s_ok, D, KIND)  # (BS, D)
        scores = tl.dot(q, tl.trans(keys.to(dtype))) * sm_scale  # (QB, BS)
        seen = s_ok[None, :] & (s[None, :] <= last[:, None])
        scores = tl.where(seen, scores, -float("inf"))
        new_best = tl.maximum(best, tl.max(scores, 1))
        correction = tl.exp(best - new_best)
        weights = tl.exp(scores - new_best[:, None])
        values = _load_block(v1, v2, v_scale, v_low, kv * S_MAX + s, s_ok, D, KIND)
        acc = acc * correction[:, None] + tl.dot(weights.to(dtype), values.to(dtype))
        total = total * correction + tl.sum(weights, 1)
        best = new_best
    slot = (t * H + head) * CHUNKS + c
    tl.store(best_ptr + slot, best, mask=r_ok)
    tl.store(total_ptr + slot, total, mask=r_ok)
    tl.store(acc_ptr + slot[:, None] * D + d[None, :], acc, mask=r_ok[:, None])


@triton.jit
def _merge_chunks_kernel(best_ptr, total_ptr, acc_ptr, pos_ptr, out_ptr, H, CHUNKS, D: tl.constexpr,
                         CHUNK: tl.constexpr):
    """Row t, head h: its chunks' states merged in chunk order -> the attention output (D,) in out's dtype."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    base = (t * H + h) * CHUNKS
    best = tl.load(best_ptr + base)
    total = tl.load(total_ptr + base)
    acc = tl.load(acc_ptr + base * D + d)
    for c in range(1, tl.cdiv(tl.load(pos_ptr) + t + 1, CHUNK)):
        chunk_best = tl.load(best_ptr + base + c)
        new_best = tl.maximum(best, chunk_best)
        old, new = tl.exp(best - new_best), tl.exp(chunk_best - new_best)
        acc = acc * old + tl.load(acc_ptr + (base + c) * D + d) * new
        total = total * old + tl.load(total_ptr + base + c) * new
        best = new_best
    tl.store(out_ptr + (t * H + h) * D + d, (acc / total).to(out_ptr.dtype.element_ty))


def attend(q: torch.Tensor, keys: tuple, values: tuple, position: torch.Tensor, heads: int, kv_heads: int,
           head_dim: int, kind: int, out_dtype: torch.dtype, chunk: int | None = None, block_s: int = 64,
           num_warps: int = 4, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q (M, >= heads * head_dim, 16-bit; row stride any): row t's queries at position P + t over the cache's
    positions [0, P + t] (one layer's planes (Hkv, S_max, ...)) -> (M, heads * head_dim) in out_dtype. The grid
    covers every chunk of the cache (the position is read on the device); chunks past a row's position do nothing.
    Chunks (default) hold at least 64 positions and are at most 64 a cache: many programs side by side, few states
    to merge. `rope` (cos, sin (S, Dh) float32): the queries are rotated to their positions as they are read."""
    rows = q.shape[0]
    max_len = keys[0].shape[1]
    chunk = chunk or max(block_s, triton.next_power_of_2(triton.cdiv(max_len, 64)))
    group = heads // kv_heads
    chunks = triton.cdiv(max_len, chunk)
    best = torch.empty((rows, heads, chunks), dtype=torch.float32, device=q.device)
    total = torch.empty_like(best)
    acc = torch.empty((rows, heads, chunks, head_dim), dtype=torch.float32, device=q.device)
    blocks = triton.cdiv(rows * group, MAX_ROWS)
    cos, sin = rope if rope is not None else (best, best)
    _attend_kernel[(kv_heads, chunks, blocks)](q, q.stride(0), *keys, *values, position, cos, sin, best, total, acc,
                                               rows, heads, max_len, chunks, head_dim ** -0.5, GROUP=group,
                                               D=head_dim, KIND=kind, CHUNK=chunk, BLOCK_S=block_s, QB=MAX_ROWS,
                                               ROPE=rope is not None, num_warps=num_warps)
    out = torch.empty((rows, heads * head_dim), dtype=out_dtype, device=q.device)
    _merge_chunks_kernel[(rows, heads)](best, total, acc, position, out, heads, chunks, D=head_dim, CHUNK=chunk)
    return out
