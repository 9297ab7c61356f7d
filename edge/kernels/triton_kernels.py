"""Triton kernels for the quantized paths; each computes exactly what its reference in edge/kernels/quant.py or
edge/kernels/kv_quant.py specifies (tests/kernels/test_triton_kernels.py checks them on fresh random inputs, on the CPU
through TRITON_INTERPRET=1 at small shapes).

    quantized_matmul(x, qweight)                     x (M, K) @ dequant(qweight).T -> (M, N); int4 or int8 codes
    quantize_vectors(x, kind)                        quantize-on-append: (R, D) -> PackedVectors (int8/hierarchical)
    quantized_decode_attention(q, keys, values, start)  queries (causal) over an int8 or hierarchical KV prefix

Layouts are the references': int4 codes two per byte (low nibble first, value + 8), one float16 scale per group
along K; KV vectors with one float16 scale (and for hierarchical, a float16 minimum) each, nibble planes packed two
per byte. Callers go through edge/kernels/dispatch.py, which picks these on a capable GPU and the references elsewhere.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from edge.kernels.kv_quant import PackedVectors
from edge.kernels.quant_weight import QuantizedWeight


@triton.jit
def _round_half_even(v):
    """torch.round's rounding (half to even), so codes match the reference bit for bit."""
    r = tl.floor(v + 0.5)
    tie = (r - v) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def hierarchical_codes(even, odd, low, high):
    """A vector's even and odd elements as QuantSpec's hierarchical codes (edge/kernels/kv_quant.py): 8-bit asymmetric
    from its min `low` and max `high`, split into the upper and lower nibble planes -> (upper, lower) uint8, and
    the float16 step and low (as float32). div_rn: IEEE division, as torch divides (Triton's default GPU division is
    approximate)."""
    low16 = low.to(tl.float16).to(tl.float32)
    step16 = tl.maximum(tl.math.div_rn(high - low16, 255.0), 1e-8).to(tl.float16).to(tl.float32)
    c_even = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(even - low16, step16)), 0.0), 255.0)
    c_odd = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(odd - low16, step16)), 0.0), 255.0)
    c_even, c_odd = c_even.to(tl.int32), c_odd.to(tl.int32)
    upper = ((c_even >> 4) | ((c_odd >> 4) << 4)).to(tl.uint8)
    lower = ((c_even & 15) | ((c_odd & 15) << 4)).to(tl.uint8)
    return upper, lower, step16, low16


@triton.jit
def int8_codes(even, odd, top):
    """A vector's even and odd elements as symmetric int8 codes at the float16 scale of its max |x| `top` ->
    (even codes, odd codes) int8 and the scale (as float32)."""
    scale16 = tl.maximum(tl.math.div_rn(top, 127.0), 1e-8).to(tl.float16).to(tl.float32)
    c_even = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(even, scale16)), -127.0), 127.0).to(tl.int8)
    c_odd = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(odd, scale16)), -127.0), 127.0).to(tl.int8)
    return c_even, c_odd, scale16


@triton.jit
def _quantized_matmul_kernel(x_ptr, codes_ptr, scales_ptr, out_ptr, N, K, GROUPS, GROUPS_PER_SPLIT,
                             BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr):
    """One row m of x against BLOCK_N rows of the weight, over split s of the groups (GROUPS_PER_SPLIT of them),
    BLOCK_G groups of GROUP inputs at a time: out[m, s, n] = sum_g scale[n, g] * sum_{k in group g} x[m, k] *
    code[n, k]. Each group's sum is scaled once, and the codes of a tile are one contiguous run per weight row."""
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
    split = tl.program_id(2)
    n_ok = n < N
    g = tl.arange(0, BLOCK_G)  # (BG,)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    first = split * GROUPS_PER_SPLIT
    last = tl.minimum(first + GROUPS_PER_SPLIT, GROUPS)
    for g0 in range(first, last, BLOCK_G):
        group = g0 + g  # (BG,)
        g_ok = group < last
        mask = n_ok[:, None, None] & g_ok[None, :, None]
        if BITS == 4:  # byte p holds inputs 2p (low nibble) and 2p + 1 (high nibble)
            pair = group[:, None] * (GROUP // 2) + tl.arange(0, GROUP // 2)[None, :]  # (BG, GROUP/2)
            x_even = tl.load(x_ptr + m * K + 2 * pair, mask=g_ok[:, None], other=0.0)  # (BG, GROUP/2)
            x_odd = tl.load(x_ptr + m * K + 2 * pair + 1, mask=g_ok[:, None], other=0.0)
            packed = tl.load(codes_ptr + n[:, None, None] * (K // 2) + pair[None, :, :], mask=mask,
                             other=0).to(tl.int32)  # (BN, BG, GROUP/2)
            even = ((packed & 15) - 8).to(tl.float32)
            odd = ((packed >> 4) - 8).to(tl.float32)
            partial = tl.sum(even * x_even[None, :, :] + odd * x_odd[None, :, :], axis=2)  # (BN, BG)
        else:
            k = group[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # (BG, GROUP)
            xs = tl.load(x_ptr + m * K + k, mask=g_ok[:, None], other=0.0)  # (BG, GROUP)
            codes = tl.load(codes_ptr + n[:, None, None] * K + k[None, :, :], mask=mask, other=0).to(tl.float32)
            partial = tl.sum(codes * xs[None, :, :], axis=2)  # (BN, BG)
        scale = tl.load(scales_ptr + n[:, None] * GROUPS + group[None, :], mask=n_ok[:, None] & g_ok[None, :],
                        other=0.0).to(tl.float32)  # (BN, BG)
        acc += tl.sum(partial * scale, axis=1)
    tl.store(out_ptr + (m * tl.num_programs(2) + split) * N + n, acc, mask=n_ok)


@triton.jit
def _sum_splits_kernel(partial_ptr, out_ptr, N, SPLITS, BLOCK: tl.constexpr):
    """out[m, n] = the splits' partial sums added in split order."""
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    acc = tl.load(partial_ptr + m * SPLITS * N + n, mask=ok, other=0.0)
    for split in range(1, SPLITS):
        acc += tl.load(partial_ptr + (m * SPLITS + split) * N + n, mask=ok, other=0.0)
    tl.store(out_ptr + m * N + n, acc, mask=ok)


def quantized_matmul(x: torch.Tensor, weight: QuantizedWeight, block_n: int = 16, block_k: int = 256,
                     num_warps: int = 4) -> torch.Tensor:
    """x (M, K) float32 @ dequant(weight).T -> (M, N) float32. Each row is computed alone, in the same order
    whatever M is, so a verify pass gives each row exactly what a one-row step gives it. A tile is block_n weight
    rows by block_k inputs (rounded to whole groups); a group size that is not a power of two runs the reference."""
    rows, columns = weight.shape
    if x.shape[-1] != columns or columns % 2:
        raise ValueError(f"x has {x.shape[-1]} features; the weight takes {columns} (an even number)")
    flat = x.reshape(-1, columns).float().contiguous()  # (M, K)
    group = weight.group_size
    if group & (group - 1) or group < 2:
        matrix = weight.dequantize().float().T  # (K, N); row by row, so that each row is computed alone
        return torch.cat([row[None] @ matrix for row in flat]).reshape(*x.shape[:-1], rows)
    groups, block_g = weight.scales.shape[1], max(1, block_k // group)
    splits, per_split = split_groups(triton.cdiv(rows, block_n), groups, block_g, x.device)
    partial = torch.empty((flat.shape[0], splits, rows), dtype=torch.float32, device=x.device)  # (M, S, N)
    grid = (flat.shape[0], triton.cdiv(rows, block_n), splits)
    _quantized_matmul_kernel[grid](flat, weight.codes, weight.scales, partial, rows, columns, groups, per_split,
                                   BITS=weight.bits, GROUP=group, BLOCK_N=block_n, BLOCK_G=block_g,
                                   num_warps=num_warps)
    if splits == 1:
        return partial.reshape(*x.shape[:-1], rows)
    out = torch.empty((flat.shape[0], rows), dtype=torch.float32, device=x.device)  # (M, N)
    _sum_splits_kernel[(flat.shape[0], triton.cdiv(rows, 1024))](partial, out, rows, splits, BLOCK=1024)
    return out.reshape(*x.shape[:-1], rows)


def split_groups(tiles: int, groups: int, block_g: int, device: torch.device) -> tuple[int, int]:
    """(splits, groups per split) of the input groups, so that a narrow weight (few output tiles, a long input:
    a down projection into a small hidden size) still gives every multiprocessor work. Depends on the weight's shape
    alone, never on the rows of x, so a verify pass adds each row's splits as a one-row step does."""
    processors = _processors(device.index or 0) if device.type == "cuda" else 4
    wanted = triton.cdiv(2 * processors, tiles)  # about two programs per multiprocessor
    splits = max(1, min(wanted, groups // (4 * block_g)))  # each split keeps at least four tiles of groups
    per_split = triton.cdiv(triton.cdiv(groups, splits), block_g) * block_g
    return triton.cdiv(groups, per_split), per_split


@triton.jit
def _quantize_kernel(x_ptr, first_ptr, second_ptr, scale_ptr, low_ptr, D,
                     HIERARCHICAL: tl.constexpr, BLOCK_D: tl.constexpr):
    """One vector (row) of D values: int8 symmetric, or hierarchical 8-bit asymmetric split into nibble planes."""
    row = tl.program_id(0)
    pair = tl.arange(0, BLOCK_D // 2)
    ok = 2 * pair < D
    even = tl.load(x_ptr + row * D + 2 * pair, mask=ok, other=0.0)
    odd = tl.load(x_ptr + row * D + 2 * pair + 1, mask=ok, other=0.0)
    if HIERARCHICAL:
        low = tl.minimum(tl.min(tl.where(ok, even, float("inf")), 0), tl.min(tl.where(ok, odd, float("inf")), 0))
        high = tl.maximum(tl.max(tl.where(ok, even, -float("inf")), 0), tl.max(tl.where(ok, odd, -float("inf")), 0))
        upper, lower, step16, low16 = hierarchical_codes(even, odd, low, high)
        tl.store(first_ptr + row * (D // 2) + pair, upper, mask=ok)
        tl.store(second_ptr + row * (D // 2) + pair, lower, mask=ok)
        tl.store(scale_ptr + row, step16.to(tl.float16))
        tl.store(low_ptr + row, low16.to(tl.float16))
    else:
        top = tl.maximum(tl.max(tl.where(ok, tl.abs(even), 0.0), 0), tl.max(tl.where(ok, tl.abs(odd), 0.0), 0))
        c_even, c_odd, scale16 = int8_codes(even, odd, top)
        tl.store(first_ptr + row * D + 2 * pair, c_even, mask=ok)
        tl.store(first_ptr + row * D + 2 * pair + 1, c_odd, mask=ok)
        tl.store(scale_ptr + row, scale16.to(tl.float16))


def quantize_vectors(x: torch.Tensor, kind: str) -> PackedVectors:
    """x (..., D) -> PackedVectors exactly as edge.kernels.kv_quant.quantize (kinds int8 and hierarchical)."""
    if kind not in ("int8", "hierarchical"):
        raise ValueError(f"the Triton quantize-on-append kernel writes int8 or hierarchical, not {kind!r}")
    dims = x.shape[-1]
    rows = x.reshape(-1, dims).float().contiguous()  # (R, D)
    count, device = rows.shape[0], x.device
    scale = torch.empty(count, dtype=torch.float16, device=device)
    if kind == "int8":
        codes = torch.empty((count, dims), dtype=torch.int8, device=device)
        _quantize_kernel[(count,)](rows, codes, codes, scale, scale, dims, HIERARCHICAL=False,
                                   BLOCK_D=triton.next_power_of_2(dims))
        return PackedVectors("int8", (codes.reshape(x.shape),), scale.reshape(*x.shape[:-1], 1))
    upper = torch.empty((count, dims // 2), dtype=torch.uint8, device=device)
    lower = torch.empty_like(upper)
    low = torch.empty(count, dtype=torch.float16, device=device)
    _quantize_kernel[(count,)](rows, upper, lower, scale, low, dims, HIERARCHICAL=True,
                               BLOCK_D=triton.next_power_of_2(dims))
    half = (*x.shape[:-1], dims // 2)
    return PackedVectors("hierarchical", (upper.reshape(half), lower.reshape(half)),
                         scale.reshape(*x.shape[:-1], 1), low.reshape(*x.shape[:-1], 1))


@triton.jit
def _load_vectors(first_ptr, second_ptr, scale_ptr, low_ptr, base, rows, row_ok, D,
                  KIND: tl.constexpr, BLOCK_D: tl.constexpr):
    """Dequantized (BLOCK_S, BLOCK_D) block of cached vectors. KIND 0: int8; 1: hierarchical, 8 bits (target);
    2: hierarchical, upper 4 bits only (draft)."""
    d = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (d[None, :] < D)
    scale = tl.load(scale_ptr + base + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    if KIND == 0:
        codes = tl.load(first_ptr + (base + rows)[:, None] * D + d[None, :], mask=mask, other=0).to(tl.float32)
        return codes * scale
    byte = (base + rows)[:, None] * (D // 2) + d[None, :] // 2
    shift = (d[None, :] % 2) * 4
    upper = (tl.load(first_ptr + byte, mask=mask, other=0).to(tl.int32) >> shift) & 15
    low = tl.load(low_ptr + base + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    if KIND == 2:
        return low + (upper.to(tl.float32) * 16.0 + 7.5) * scale
    lower = (tl.load(second_ptr + byte, mask=mask, other=0).to(tl.int32) >> shift) & 15
    return low + (upper * 16 + lower).to(tl.float32) * scale


@triton.jit
def _decode_attention_kernel(q_ptr, k1, k2, k_scale, k_low, v1, v2, v_scale, v_low, best_ptr, total_ptr, acc_ptr,
                             START, H, S_MAX, D, GROUP, CHUNKS, sm_scale, KIND: tl.constexpr, CHUNK: tl.constexpr,
                             BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Head h, query t (at position START + t), chunk c: the online-softmax state (running max, sum of weights,
    weighted sum of values) of q . K^T * sm_scale over cached positions [c * CHUNK, (c + 1) * CHUNK) that the query
    sees ([0, START + t]). Chunks are fixed stretches of positions, so a query's chunks are the same whatever other
    queries run beside it."""
    h = tl.program_id(0)
    t = tl.program_id(1)
    c = tl.program_id(2)
    S = START + t + 1
    kv_base = (h // GROUP) * S_MAX  # vector index of position 0 of this head's KV head
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + (t * H + h) * D + d, mask=d < D, other=0.0)
    best = tl.max(tl.full((BLOCK_S,), -float("inf"), tl.float32), 0)  # running max (a scalar tensor)
    total = tl.sum(tl.zeros((BLOCK_S,), dtype=tl.float32), 0)  # running sum of weights
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    end = tl.minimum(S, (c + 1) * CHUNK)
    for s0 in range(c * CHUNK, end, BLOCK_S):
        rows = s0 + tl.arange(0, BLOCK_S)
        row_ok = rows < end
        keys = _load_vectors(k1, k2, k_scale, k_low, kv_base, rows, row_ok, D, KIND, BLOCK_D)
        scores = tl.where(row_ok, tl.sum(keys * q[None, :], axis=1) * sm_scale, -float("inf"))  # (BLOCK_S,)
        new_best = tl.maximum(best, tl.max(scores, 0))
        correction = tl.exp(best - new_best)
        weights = tl.exp(scores - new_best)
        values = _load_vectors(v1, v2, v_scale, v_low, kv_base, rows, row_ok, D, KIND, BLOCK_D)
        acc = acc * correction + tl.sum(weights[:, None] * values, axis=0)
        total = total * correction + tl.sum(weights, 0)
        best = new_best
    slot = (t * H + h) * CHUNKS + c
    tl.store(best_ptr + slot, best)
    tl.store(total_ptr + slot, total)
    tl.store(acc_ptr + slot * D + d, acc, mask=d < D)


@triton.jit
def _combine_chunks_kernel(best_ptr, total_ptr, acc_ptr, out_ptr, START, H, D, CHUNKS, CHUNK: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    """Head h, query t: its chunks' softmax states merged in chunk order -> the attention output (D,)."""
    h = tl.program_id(0)
    t = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    base = (t * H + h) * CHUNKS
    best = tl.load(best_ptr + base)
    total = tl.load(total_ptr + base)
    acc = tl.load(acc_ptr + base * D + d, mask=d < D, other=0.0)
    for c in range(1, tl.cdiv(START + t + 1, CHUNK)):
        chunk_best = tl.load(best_ptr + base + c)
        new_best = tl.maximum(best, chunk_best)
        old, new = tl.exp(best - new_best), tl.exp(chunk_best - new_best)
        acc = acc * old + tl.load(acc_ptr + (base + c) * D + d, mask=d < D, other=0.0) * new
        total = total * old + tl.load(total_ptr + base + c) * new
        best = new_best
    tl.store(out_ptr + (t * H + h) * D + d, acc / total, mask=d < D)


def quantized_decode_attention(q: torch.Tensor, keys: PackedVectors, values: PackedVectors, start: int, *,
                               draft: bool = False, block_s: int = 32, chunk: int = 256,
                               num_warps: int = 4) -> torch.Tensor:
    """q (T, H, D): queries at positions [start, start + T), each over cached positions up to its own (causal), of
    keys/values stored (Hkv, S_max, ...) as int8 or hierarchical PackedVectors -> (T, H, D). `draft` reads a
    hierarchical cache's upper 4 bits only. The positions are split in chunks of `chunk` (a multiple of block_s)
    that run side by side, then merged in order."""
    steps, heads, dims = q.shape
    kv_heads, max_len = keys.scale.shape[0], keys.scale.shape[1]
    if keys.kind != values.kind or keys.kind not in ("int8", "hierarchical"):
        raise ValueError(f"quantized attention reads int8 or hierarchical caches, got {keys.kind}/{values.kind}")
    kind = 0 if keys.kind == "int8" else (2 if draft else 1)

    def planes(packed: PackedVectors):
        first = packed.planes[0]
        second = packed.planes[1] if len(packed.planes) > 1 else first
        low = packed.low if packed.low is not None else packed.scale
        return first, second, packed.scale, low

    chunks = triton.cdiv(start + steps, chunk)
    best = torch.empty((steps, heads, chunks), dtype=torch.float32, device=q.device)
    total = torch.empty_like(best)
    acc = torch.empty((steps, heads, chunks, dims), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(dims)
    _decode_attention_kernel[(heads, steps, chunks)](
        q.float().contiguous(), *planes(keys), *planes(values), best, total, acc, start, heads, max_len, dims,
        heads // kv_heads, chunks, dims ** -0.5, KIND=kind, CHUNK=chunk, BLOCK_S=block_s, BLOCK_D=block_d,
        num_warps=num_warps)
    out = torch.empty((steps, heads, dims), dtype=torch.float32, device=q.device)
    _combine_chunks_kernel[(heads, steps)](best, total, acc, out, start, heads, dims, chunks, CHUNK=chunk,
                                           BLOCK_D=block_d)
    return out


@lru_cache(maxsize=None)
def _processors(device: int) -> int:
    """The GPU's multiprocessors, asked once (split_groups runs for every matmul of a decode step)."""
    return torch.cuda.get_device_properties(device).multi_processor_count

