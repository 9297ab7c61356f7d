"""CPU kernel benchmark: read bandwidth and, per weights format, a model's matmuls per token against it, per path.

    python -m edge.kernels.cpu_bench [--shape tinyllama-1.1b] [--paths avx2,portable] [--formats float32,float16,int8,int4]
                                [--rows 1,2,4,8] [--repeats 5]

Bandwidth is edge.kernels.cpu_kernel.CpuKernel.read_bandwidth: a 1 GiB buffer summed on the kernel's threads, the best
of several stream counts, probed in turns with the matmuls of each format (a shared VM's memory speed drifts by tens
of percent over minutes, so a probe taken once, minutes away, is no reference). A token's matmuls are every layer's four matrices and the head of the shape
(the weights of a real model's size, far larger than the caches, so they come from memory as in decoding), timed
for 1 row (a decode step's matmuls) and for k rows (a verify pass's): GB/s is the format's bytes over the 1-row
time, c(k) the k-row time over the 1-row time. Runs the probe and the row counts in turns and takes each one's best,
so drift in the machine's speed hits them alike. Attention, norms and the rest of a step are not included (bench.calls times
whole calls).
"""

from __future__ import annotations

import argparse
import time

import torch

SHAPES = {  # (layers, hidden, intermediate, q + 2 kv outputs, head rows)
    "builtin": (12, 256, 768, 512, 4096),
    "smollm-135m": (30, 576, 1536, 960, 49152),
    "tinyllama-1.1b": (22, 2048, 5632, 2560, 32000),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def token_matrices(shape: str, fmt: str) -> list[tuple[torch.Tensor, int, int]]:
    """(weights in `fmt`, N, K) for every matmul of one token: each layer's own copies, then the head. int4 is edge's
    (4-bit blocks of 32 with a scale and minimum: edge/kernels/block_formats.py BlockMatrix, whose `nbytes` it reports)."""
    from edge.kernels.block_formats import BlockMatrix
    from edge.kernels.cpu_packing import pack_int8

    layers, hidden, inner, qkv, vocab = SHAPES[shape]
    sizes = [(qkv, hidden), (hidden, hidden), (2 * inner, hidden), (hidden, inner)]
    generator = torch.Generator().manual_seed(0)
    templates = {}
    for rows, columns in sizes + [(vocab, hidden)]:
        weight = torch.randn(rows, columns, generator=generator) * 0.02
        templates[rows, columns] = (pack_int8(weight) if fmt == "int8" else weight if fmt == "int4"
                                    else weight.to(DTYPES[fmt]))

    def copy(template: torch.Tensor):
        return BlockMatrix.quantized("q4_1", template) if fmt == "int4" else template.clone()

    matrices = [(copy(templates[size]), *size) for _ in range(layers) for size in sizes]
    return matrices + [(copy(templates[vocab, hidden]), vocab, hidden)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge.kernels.cpu_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama-1.1b")
    parser.add_argument("--paths", help="comma-separated kernel paths (default: every path this CPU runs)")
    parser.add_argument("--formats", default="float32,float16,int8,int4")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bandwidth-megabytes", type=int, default=1024, help="the bandwidth probe's buffer (MiB)")
    args = parser.parse_args(argv)
    from edge.kernels import cpu_paths
    from edge.kernels.cpu_kernel import CpuKernel

    rows = sorted({1, *(int(r) for r in args.rows.split(","))})
    paths = args.paths.split(",") if args.paths else cpu_paths.runnable_paths()
    print(f"| path | format | MB per token | 1 row ms | GB/s of probed GB/s (share) | "
          + " | ".join(f"c({k})" for k in rows[1:]) + " |")
    print("|---|---|---:|---:|---:|" + "---:|" * (len(rows) - 1))
    probe = torch.ones(args.bandwidth_megabytes * 2**20 // 4, dtype=torch.float32)  # read by every bandwidth probe
    for path in paths:
        kernel = CpuKernel.for_path(path)
        if kernel is None:
            print(f"| {path} | (cannot be built here) |")
            continue
        for fmt in args.formats.split(","):
            matrices = token_matrices(args.shape, fmt)
            total = sum(weight.nbytes for weight, _, _ in matrices)  # a BlockMatrix's too
            inputs = {(k, columns): torch.randn(k, columns) for k in rows for _, _, columns in matrices}

            def token(k: int) -> None:
                for weight, n, columns in matrices:
                    x = inputs[k, columns]
                    if fmt == "int4":
                        kernel.blocks(x, weight)
                    elif fmt == "int8":
                        kernel.quantized(x, weight, fmt, n)
                    else:
                        kernel(x, weight)

            token(1)
            best = {k: float("inf") for k in rows}
            bandwidth = 0.0
            for _ in range(args.repeats):
                bandwidth = max(bandwidth, kernel.read_bandwidth(repeats=1, data=probe))
                for k in rows:
                    started = time.perf_counter()
                    token(k)
                    best[k] = min(best[k], time.perf_counter() - started)
            rate = total / best[1] / 1e9
            print(f"| {kernel.path} | {fmt} | {total / 1e6:.0f} | {best[1] * 1e3:.1f} | {rate:.1f} of {bandwidth:.1f} "
                  f"({100 * rate / bandwidth:.0f}%) | " + " | ".join(f"{best[k] / best[1]:.2f}" for k in rows[1:])
                  + " |")
    print(f"\n{args.shape}: every layer's matrices and the head, {torch.get_num_threads()} threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
