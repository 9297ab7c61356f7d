"""Kernel benchmark: achieved memory bandwidth of the Triton kernels against the GPU's measured copy bandwidth.

    python -m edge.kernels.bench [--group 128] [--sweep]

Measured bandwidth is a large device-to-device copy (bytes read + written per second). The int4 and int8 GEMVs (a
decode step's one row of x, a verify pass's four) are bound by reading their codes and scales; their GB/s counts
those bytes once plus x and y. The hierarchical-KV decode attention is bound by reading the cache's planes (the upper
plane alone for a draft) and scales. Needs a CUDA GPU of compute
capability 8.0 or newer; elsewhere it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def timed_ms(function, repeats: int = 50) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(5):
        function()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


# (rows, N, K): a decode step, a verify pass, a down projection, a narrow long one (split along K)
GEMV_SHAPES = ((1, 8192, 8192), (4, 8192, 8192), (1, 4096, 14336), (1, 256, 108160))
GEMV_TILES = [(block_n, block_k, warps) for block_n in (8, 16, 32, 64) for block_k in (128, 256, 512, 1024)
              for warps in (4, 8)]
ATTENTION_CASES = ((32, 8, 128, 4096), (32, 8, 128, 32768))  # (heads, kv heads, head dim, cached positions)


def gemv_report(bits: int, rows: int, n: int, k: int, group: int, bandwidth: float, sweep: bool) -> dict:
    """The quantized matmul at its default tiles (and, with `sweep`, every tile in GEMV_TILES): ms, GB/s counting
    the codes and scales once plus x and y, and the share of the copy bandwidth."""
    from edge.kernels.quant import quantize_weight
    from edge.kernels.triton_kernels import quantized_matmul

    weight = quantize_weight(torch.randn(n, k, device="cuda"), bits=bits, group_size=group)
    x = torch.randn(rows, k, device="cuda")
    moved = weight.nbytes + x.nbytes + rows * n * 4

    def measure(**tiles) -> dict:
        ms = timed_ms(lambda: quantized_matmul(x, weight, **tiles))
        return {"ms": round(ms, 4), "gb_s": round(moved / (ms / 1e3) / 1e9, 1),
                "share_of_bandwidth": round(moved / (ms / 1e3) / 1e9 / bandwidth, 3)}

    report = {"bits": bits, "rows": rows, "n": n, "k": k, "group": group, "default": measure()}
    if sweep:
        tiles = {f"{block_n}x{block_k}/w{warps}": measure(block_n=block_n, block_k=block_k, num_warps=warps)
                 for block_n, block_k, warps in GEMV_TILES}
        best = min(tiles, key=lambda name: tiles[name]["ms"])
        report["best"] = {"tiles": best, **tiles[best]}
        report["sweep"] = tiles
    return report


def attention_report(heads: int, kv_heads: int, dims: int, cached: int, draft: bool, bandwidth: float,
                     sweep: bool) -> dict:
    """Decode attention of one query over a hierarchical cache of `cached` positions: GB/s counting the planes it
    reads (the upper plane alone for a draft) and their scales."""
    from edge.kernels.kv_quant import quantize
    from edge.kernels.triton_kernels import quantized_decode_attention

    keys = quantize(torch.randn(kv_heads, cached + 8, dims, device="cuda"), "hierarchical")
    values = quantize(torch.randn(kv_heads, cached + 8, dims, device="cuda"), "hierarchical")
    q = torch.randn(1, heads, dims, device="cuda")
    per_vector = dims // 2 * (1 if draft else 2) + 2 + (0 if draft else 2)  # nibble planes, float16 scale and low
    moved = 2 * kv_heads * cached * per_vector

    def measure(**options) -> dict:
        ms = timed_ms(lambda: quantized_decode_attention(q, keys, values, cached - 1, draft=draft, **options))
        return {"ms": round(ms, 4), "gb_s": round(moved / (ms / 1e3) / 1e9, 1),
                "share_of_bandwidth": round(moved / (ms / 1e3) / 1e9 / bandwidth, 3)}

    report = {"heads": heads, "kv_heads": kv_heads, "head_dim": dims, "cached": cached, "draft": draft,
              "default": measure()}
    if sweep:
        options = {f"s{block_s}/c{chunk}/w{warps}": measure(block_s=block_s, chunk=chunk, num_warps=warps)
                   for block_s in (32, 64) for chunk in (128, 256, 512) for warps in (2, 4)}
        best = min(options, key=lambda name: options[name]["ms"])
        report["best"] = {"options": best, **options[best]}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge.kernels.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--sweep", action="store_true", help="also time every tile size (GEMV_TILES) and report "
                        "the fastest")
    args = parser.parse_args(argv)
    from edge.kernels.dispatch import MIN_CAPABILITY

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_CAPABILITY:
        print("edge.kernels.bench: needs a CUDA GPU of compute capability 8.0 or newer; nothing was measured",
              file=sys.stderr)
        return 2
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    copy_ms = timed_ms(lambda: target.copy_(source))
    bandwidth = 2 * source.nbytes / (copy_ms / 1e3) / 1e9
    report = {"device": torch.cuda.get_device_name(), "copy_bandwidth_gb_s": round(bandwidth, 1),
              "gemv": [gemv_report(bits, rows, n, k, args.group, bandwidth, args.sweep)
                       for bits in (4, 8) for rows, n, k in GEMV_SHAPES],
              "attention": [attention_report(*case, draft, bandwidth, args.sweep)
                            for case in ATTENTION_CASES for draft in (False, True)]}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
