"""Triton kernels for the quantized paths; each computes exactly what its reference in kernels/quant.py or
kernels/kv_quant.py specifies (tests/test_triton_kernels.py checks them on fresh random inputs, on the CPU through
TRITON_INTERPRET=1 at small shapes).

    quantized_matmul(x, qweight)                     x (M, K) @ dequant(qweight).T -> (M, N); int4 or int8 codes
    quantize_vectors(x, kind)                        quantize-on-append: (R, D) -> PackedVectors (int8/hierarchical)
    quantized_decode_attention(q, keys, values, start)  queries (causal) over an int8 or hierarchical KV prefix

Layouts are the references': int4 codes two per byte (low nibble first, value + 8), one float16 scale per group
along K; KV vectors with one float16 scale (and for hierarchical, a float16 minimum) each, nibble planes packed two
per byte. Callers go through kernels/dispatch.py, which picks these on a capable GPU and the references elsewhere.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kv_quant import PackedVectors
from kernels.quant_weight import QuantizedWeight


@triton.jit
def _round_half_even(v):
    """torch.round's rounding (half to even), so codes match the reference bit for bit."""
    r = tl.floor(v + 0.5)
    tie = (r - v) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _quantized_matmul_kernel(x_ptr, codes_ptr, scales_ptr, out_ptr, N, K, GROUPS, group_size,
                             BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row m of x against BLOCK_N output columns: out[m, n] = sum_k x[m, k] * code[n, k] * scale[n, k // g]."""
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    n_ok = n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    half = tl.arange(0, BLOCK_K // 2)  # pairs of k: even k uses the low nibble, odd k the high one
    for k0 in range(0, K, BLOCK_K):
        k_even = k0 + 2 * half  # (BLOCK_K/2,)
        k_ok = k_even < K
        x_even = tl.load(x_ptr + m * K + k_even, mask=k_ok, other=0.0)
        x_odd = tl.load(x_ptr + m * K + k_even + 1, mask=k_ok, other=0.0)
        mask = n_ok[:, None] & k_ok[None, :]
        scale_even = tl.load(scales_ptr + n[:, None] * GROUPS + k_even[None, :] // group_size, mask=mask,
                             other=0.0).to(tl.float32)
        scale_odd = tl.load(scales_ptr + n[:, None] * GROUPS + (k_even[None, :] + 1) // group_size, mask=mask,
                            other=0.0).to(tl.float32)
        if BITS == 4:
            packed = tl.load(codes_ptr + n[:, None] * (K // 2) + (k_even[None, :] // 2), mask=mask, other=0)
            packed = packed.to(tl.int32)
            low = ((packed & 15) - 8).to(tl.float32)  # (BLOCK_N, BLOCK_K/2)
            high = ((packed >> 4) - 8).to(tl.float32)
        else:
            low = tl.load(codes_ptr + n[:, None] * K + k_even[None, :], mask=mask, other=0).to(tl.float32)
            high = tl.load(codes_ptr + n[:, None] * K + k_even[None, :] + 1, mask=mask, other=0).to(tl.float32)
        acc += tl.sum(low * scale_even * x_even[None, :] + high * scale_odd * x_odd[None, :], axis=1)
    tl.store(out_ptr + m * N + n, acc, mask=n_ok)


def quantized_matmul(x: torch.Tensor, weight: QuantizedWeight, block_n: int = 32, block_k: int = 64) -> torch.Tensor:
    """x (M, K) float32 @ dequant(weight).T -> (M, N) float32."""
    rows, columns = weight.shape
    if x.shape[-1] != columns or columns % 2:
        raise ValueError(f"x has {x.shape[-1]} features; the weight takes {columns} (an even number)")
    flat = x.reshape(-1, columns).float().contiguous()  # (M, K)
    out = torch.empty((flat.shape[0], rows), dtype=torch.float32, device=x.device)  # (M, N)
    grid = (flat.shape[0], triton.cdiv(rows, block_n))
    _quantized_matmul_kernel[grid](flat, weight.codes, weight.scales, out, rows, columns, weight.scales.shape[1],
                                   weight.group_size, BITS=weight.bits, BLOCK_N=block_n, BLOCK_K=block_k)
    return out.reshape(*x.shape[:-1], rows)


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
        low16 = low.to(tl.float16).to(tl.float32)
        # div_rn: IEEE division, as torch divides (Triton's default GPU division is approximate)
        step16 = tl.maximum(tl.math.div_rn(high - low16, 255.0), 1e-8).to(tl.float16).to(tl.float32)
        c_even = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(even - low16, step16)), 0.0), 255.0)
        c_odd = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(odd - low16, step16)), 0.0), 255.0)
        c_even, c_odd = c_even.to(tl.int32), c_odd.to(tl.int32)
        upper = ((c_even >> 4) | ((c_odd >> 4) << 4)).to(tl.uint8)
        lower = ((c_even & 15) | ((c_odd & 15) << 4)).to(tl.uint8)
        tl.store(first_ptr + row * (D // 2) + pair, upper, mask=ok)
        tl.store(second_ptr + row * (D // 2) + pair, lower, mask=ok)
        tl.store(scale_ptr + row, step16.to(tl.float16))
        tl.store(low_ptr + row, low16.to(tl.float16))
    else:
        top = tl.maximum(tl.max(tl.where(ok, tl.abs(even), 0.0), 0), tl.max(tl.where(ok, tl.abs(odd), 0.0), 0))
        scale16 = tl.maximum(tl.math.div_rn(top, 127.0), 1e-8).to(tl.float16).to(tl.float32)
        c_even = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(even, scale16)), -127.0), 127.0).to(tl.int8)
        c_odd = tl.minimum(tl.maximum(_round_half_even(tl.math.div_rn(odd, scale16)), -127.0), 127.0).to(tl.int8)
        tl.store(first_ptr + row * D + 2 * pair, c_even, mask=ok)
        tl.store(first_ptr + row * D + 2 * pair + 1, c_odd, mask=ok)
        tl.store(scale_ptr + row, scale16.to(tl.float16))


def quantize_vectors(x: torch.Tensor, kind: str) -> PackedVectors:
    """x (..., D) -> PackedVectors exactly as kernels.kv_quant.quantize (kinds int8 and hierarchical)."""
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
def _decode_attention_kernel(q_ptr, k1, k2, k_scale, k_low, v1, v2, v_scale, v_low, out_ptr, START, H, S_MAX, D,
                             GROUP, sm_scale, KIND: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Head h, query t (at position START + t): softmax(q . K^T * sm_scale) V over cached positions [0, START + t]
    of its KV head, with an online softmax. Every (h, t) is computed alone and in the same order, so a verify pass
    of T queries gives each query exactly what a one-query step gives it."""
    h = tl.program_id(0)
    t = tl.program_id(1)
    S = START + t + 1
    kv_base = (h // GROUP) * S_MAX  # vector index of position 0 of this head's KV head
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + (t * H + h) * D + d, mask=d < D, other=0.0)
    best = tl.max(tl.full((BLOCK_S,), -float("inf"), tl.float32), 0)  # running max (a scalar tensor)
    total = tl.sum(tl.zeros((BLOCK_S,), dtype=tl.float32), 0)  # running sum of weights
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        rows = s0 + tl.arange(0, BLOCK_S)
        row_ok = rows < S
        keys = _load_vectors(k1, k2, k_scale, k_low, kv_base, rows, row_ok, D, KIND, BLOCK_D)
        scores = tl.where(row_ok, tl.sum(keys * q[None, :], axis=1) * sm_scale, -float("inf"))  # (BLOCK_S,)
        new_best = tl.maximum(best, tl.max(scores, 0))
        correction = tl.exp(best - new_best)
        weights = tl.exp(scores - new_best)
        values = _load_vectors(v1, v2, v_scale, v_low, kv_base, rows, row_ok, D, KIND, BLOCK_D)
        acc = acc * correction + tl.sum(weights[:, None] * values, axis=0)
        total = total * correction + tl.sum(weights, 0)
        best = new_best
    tl.store(out_ptr + (t * H + h) * D + d, acc / total, mask=d < D)


def quantized_decode_attention(q: torch.Tensor, keys: PackedVectors, values: PackedVectors, start: int, *,
                               draft: bool = False, block_s: int = 32) -> torch.Tensor:
    """q (T, H, D): queries at positions [start, start + T), each over cached positions up to its own (causal), of
    keys/values stored (Hkv, S_max, ...) as int8 or hierarchical PackedVectors -> (T, H, D). `draft` reads a
    hierarchical cache's upper 4 bits only."""
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

    out = torch.empty((steps, heads, dims), dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(heads, steps)](q.float().contiguous(), *planes(keys), *planes(values), out, start,
                                             heads, max_len, dims, heads // kv_heads, dims ** -0.5, KIND=kind,
                                             BLOCK_S=block_s, BLOCK_D=triton.next_power_of_2(dims))
    return out
