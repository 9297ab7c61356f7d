"""Kernel benchmark: achieved memory bandwidth of the Triton kernels against the GPU's measured copy bandwidth.

    python -m edge.kernels.bench [--group 128] [--sweep] [--step-only]

Measured bandwidth is a large device-to-device copy (bytes read + written per second). The int4 and int8 GEMVs (a
decode step's one row of x, a verify pass's four) are bound by reading their codes and scales; their GB/s counts
those bytes once plus x and y. The hierarchical-KV decode attention is bound by reading the cache's planes (the upper
plane alone for a draft) and scales. The static decode step's kernels (edge/kernels/step_kernels.py: 16-bit
activations, GEMV of 16-bit, int8 and int4 weights, the grouped attention) are timed from CUDA graphs of 20 calls
over weight copies larger than the L2 cache. Needs a CUDA GPU of compute capability 8.0 or newer; elsewhere it says
so and exits 2.
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


def graph_ms(functions: list, repeats: int = 20) -> float:
    """Device time of one call, from a CUDA graph of `repeats` calls cycling through `functions` (several copies of
    the inputs, together larger than the L2 cache, so that every call reads device memory): no launch gaps."""
    for function in functions:
        function()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(repeats):
            functions[i % len(functions)]()
    graph.replay()
    torch.cuda.synchronize()
    return timed_ms(graph.replay, repeats=20) / repeats


# (rows, N, K): a decode step and a verify pass on 8192 x 8192, and the widened 1B target's MLP (gate/up, down)
STEP_SHAPES = ((1, 8192, 8192), (4, 8192, 8192), (1, 216320, 256), (1, 256, 108160))
DENSE_SWEEP = [{"block_n": block_n, "num_warps": warps, "num_stages": stages}
               for block_n, warps, stages in ((32, 4, 3), (64, 4, 3), (128, 8, 3), (64, 8, 3), (32, 4, 5), (64, 4, 5))]
QUANTIZED_SWEEP = [{"unpack": 1, "block_n": 64, "num_warps": 4}, {"unpack": 3, "block_n": 64, "num_warps": 4}] + \
                  [{"unpack": 4, "block_n": block_n, "num_warps": warps, **extra}
                   for block_n, warps, extra in ((32, 4, {}), (64, 4, {}), (128, 4, {}), (128, 8, {}), (256, 8, {}),
                                                 (64, 4, {"steps": 2}), (128, 8, {"steps": 2}), (64, 4, {"splits": 1}),
                                                 (128, 8, {"splits": 1}), (128, 4, {"splits": 1}))]
SWEPT = {("int4", STEP_SHAPES[0]), ("int4", STEP_SHAPES[1]), ("int4", STEP_SHAPES[2]), ("int4", STEP_SHAPES[3]),
         ("int8", STEP_SHAPES[0]), ("int8", STEP_SHAPES[3])}


def step_gemv_report(fmt: str, rows: int, n: int, k: int, bandwidth: float, sweep: bool) -> dict:
    """The static step's matmul (edge/kernels/step_kernels.py) on float16 activations: `fmt` float16 weights, or
    int8 / int4 in groups of 128 (32 for the 256-wide input). GB/s counts the weight bytes (codes and scales) once
    plus x and y."""
    from edge.kernels import step_kernels
    from edge.kernels.quant import quantize_weight

    group = 128 if k % 128 == 0 and k > 256 else 32
    copies = max(1, -(-(256 << 20) // (n * k * (2 if fmt == "float16" else 1))))  # > 256 MB together: past the L2
    weights = []
    for _ in range(min(copies, 8)):
        dense = torch.randn(n, k, device="cuda") * 0.02
        weights.append(dense.half() if fmt == "float16" else quantize_weight(dense, 8 if fmt == "int8" else 4, group))
    x = torch.randn(rows, k, device="cuda").half()
    nbytes = weights[0].nbytes if fmt != "float16" else weights[0].numel() * 2
    moved = nbytes + x.nbytes + rows * n * 2

    def measure(steps: int = 1, **tiles) -> dict:  # steps: that many times the word kernel's inputs a step
        if steps > 1:
            tiles["block_k"] = steps * step_kernels.linear_tiles(weights[0], x.device, unpack=4)[1]
        ms = graph_ms([lambda w=w: step_kernels.linear(x, w, **tiles) for w in weights])
        return {"ms": round(ms, 4), "gb_s": round(moved / (ms / 1e3) / 1e9, 1),
                "share_of_bandwidth": round(moved / (ms / 1e3) / 1e9 / bandwidth, 3)}

    report = {"format": fmt, "rows": rows, "n": n, "k": k, "group": group if fmt != "float16" else None,
              "default": measure()}
    if sweep:
        tiles = {"/".join(f"{key}={value}" for key, value in options.items()): measure(**options)
                 for options in (DENSE_SWEEP if fmt == "float16" else QUANTIZED_SWEEP)}
        best = min(tiles, key=lambda name: tiles[name]["ms"])
        report["best"] = {"tiles": best, **tiles[best]}
        report["sweep"] = tiles
    return report


# one layer of the widened 1B target's projections (hidden 256, MLP width 108,160, 4 + 2 + 2 heads of 64) as the
# static step calls them: (name, rows N, inputs K, options of step_kernels.linear)
LAYER_PROJECTIONS = (("qkv", 512, 256, {"norm": True}), ("o", 256, 256, {"residual": True}),
                     ("gate_up", 216320, 256, {"norm": True, "glu_out": True}),
                     ("down", 256, 108160, {"residual": True}))


def step_layer_report(fmt: str, unpack: int | None) -> dict:
    """The static step's four projections of one layer of the widened 1B target, one row of x, as the step calls
    them (RMSNorm read by qkv and gate/up, SwiGLU written by gate/up, residual added by o and down): `fmt` float16
    weights, or int8 / int4 in groups of 32 (QuantSpec's drafts); `unpack` as step_kernels.linear's. Each ms from a
    CUDA graph over weight copies larger than the L2 cache; GB/s counts the weight bytes."""
    from edge.kernels import step_kernels
    from edge.kernels.quant import quantize_weight

    report = {"format": fmt, "unpack": unpack, "projections": {}}
    total_ms = total_bytes = 0.0
    for name, n, k, options in LAYER_PROJECTIONS:
        copies = max(1, min(8, -(-(256 << 20) // (n * k * (2 if fmt == "float16" else 1)))))
        weights = []
        for _ in range(copies):
            dense = torch.randn(n, k, device="cuda") * 0.02
            weights.append(dense.half() if fmt == "float16" else quantize_weight(dense, 8 if fmt == "int8" else 4, 32))
        x = torch.randn(1, k, device="cuda").half()
        residual = torch.randn(1, n, device="cuda").half() if options.get("residual") else None
        norm = (torch.ones(k, device="cuda").half(), 1e-5) if options.get("norm") else None
        glu_out = options.get("glu_out", False)
        ms = graph_ms([lambda w=w: step_kernels.linear(x, w, residual, norm=norm, glu_out=glu_out, unpack=unpack)
                       for w in weights])
        nbytes = weights[0].nbytes if fmt != "float16" else weights[0].numel() * 2
        report["projections"][name] = {"ms": round(ms, 4), "gb_s": round(nbytes / (ms / 1e3) / 1e9, 1)}
        total_ms, total_bytes = total_ms + ms, total_bytes + nbytes
    report["layer_ms"] = round(total_ms, 4)
    report["layer_gb_s"] = round(total_bytes / (total_ms / 1e3) / 1e9, 1)
    return report


def step_attention_report(heads: int, kv_heads: int, dims: int, cached: int, draft: bool, bandwidth: float) -> dict:
    """The static step's attention (one program per KV head and chunk) of one query over a hierarchical cache of
    `cached` positions: GB/s counting the planes it reads (the upper plane alone for a draft) and their scales."""
    from edge.kernels import step_kernels
    from edge.kernels.kv_quant import quantize

    def planes():
        packed = quantize(torch.randn(kv_heads, cached + 16, dims, device="cuda"), "hierarchical")
        return (*packed.planes, packed.scale, packed.low)

    keys, values = planes(), planes()
    q = torch.randn(1, heads * dims, device="cuda").half()
    position = torch.tensor([cached - 1], dtype=torch.int32, device="cuda")
    kind = step_kernels.HIERARCHICAL_DRAFT if draft else step_kernels.HIERARCHICAL
    per_vector = dims // 2 * (1 if draft else 2) + 2 + (0 if draft else 2)
    moved = 2 * kv_heads * cached * per_vector
    ms = graph_ms([lambda: step_kernels.attend(q, keys, values, position, heads, kv_heads, dims, kind,
                                               torch.float16)])
    return {"heads": heads, "kv_heads": kv_heads, "head_dim": dims, "cached": cached, "draft": draft,
            "ms": round(ms, 4), "gb_s": round(moved / (ms / 1e3) / 1e9, 1),
            "share_of_bandwidth": round(moved / (ms / 1e3) / 1e9 / bandwidth, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge.kernels.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--sweep", action="store_true", help="also time every tile size (GEMV_TILES) and report "
                        "the fastest")
    parser.add_argument("--step-only", action="store_true", help="time the static step's kernels (and one GEMV of "
                        "the eager path to compare) only")
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
    report = {"device": torch.cuda.get_device_name(), "copy_bandwidth_gb_s": round(bandwidth, 1)}
    if args.step_only:  # the static step's kernels, and the eager path's int4 GEMV at one shape to compare
        report["gemv"] = [gemv_report(4, 1, 8192, 8192, args.group, bandwidth, False)]
    else:
        report["gemv"] = [gemv_report(bits, rows, n, k, args.group, bandwidth, args.sweep)
                          for bits in (4, 8) for rows, n, k in GEMV_SHAPES]
        report["attention"] = [attention_report(*case, draft, bandwidth, args.sweep)
                               for case in ATTENTION_CASES for draft in (False, True)]
    report["step_gemv"] = []
    for fmt in ("float16", "int8", "int4"):
        for shape in STEP_SHAPES:
            report["step_gemv"].append(step_gemv_report(fmt, *shape, bandwidth, args.sweep and (fmt, shape) in SWEPT))
            print(json.dumps(report["step_gemv"][-1]), file=sys.stderr, flush=True)  # kept if a time limit ends it
    report["step_layer"] = []
    for fmt, unpack in (("float16", None), ("int4", 4), ("int4", 3), ("int8", 4), ("int8", 1)):
        try:
            report["step_layer"].append(step_layer_report(fmt, unpack))
        except Exception as error:  # noqa: BLE001 - a report of what failed, the rest still measured
            report["step_layer"].append({"format": fmt, "unpack": unpack, "error": repr(error)})
        print(json.dumps(report["step_layer"][-1]), file=sys.stderr, flush=True)
    report["step_attention"] = [step_attention_report(*case, draft, bandwidth)
                                for case in ATTENTION_CASES for draft in (False, True)]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
