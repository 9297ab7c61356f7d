"""What the arithmetic of one more row costs in the block-format matmul, with the weights in the core's cache: the
part of a verify pass that memory speed cannot hide.

    python -m bench.tiles MODEL.gguf [--rows 1,2,3,4,5,8] [--kilobytes 640] [--repeats 7]

For each block format the file holds (Q4_K, Q6_K, Q4_0, ...), the first rows of one of its tensors, as many as fit
in `--kilobytes` (so that they stay in the core's L2 cache), are multiplied by R rows of activations, on one thread,
in the kernel path this CPU runs (EDGE_CPU_KERNEL forces another). A call over 16 weight rows gives the fixed cost of
a call, taken off the others. Per format: the microseconds of arithmetic for one row and for each extra row, the
multiply-adds per second of an extra row, and the range c(R) would lie in if the weights came at `--bandwidth` GB/s
per core: between the arithmetic hiding entirely behind the memory and none of it doing so. A verify pass of R rows can
cost no less than its arithmetic: where R rows' arithmetic outlasts the memory time, c(R) rises with R whatever the
memory does.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

FIXED_ROWS = 16  # weight rows of the call that measures a call's fixed cost


def tensors_by_format(path: str) -> dict[str, object]:
    """One 2-D tensor per block format in the file (the first of each), by format name (q4_k, q6_k, ...)."""
    from gguf import GGUFReader

    from edge.kernels.block_formats import FORMATS

    found: dict[str, object] = {}
    for tensor in GGUFReader(path).tensors:
        name = tensor.tensor_type.name.lower()
        if name in FORMATS and len(tensor.shape) == 2 and name not in found and name not in ("f32", "f16", "bf16"):
            found[name] = tensor
    return found


def slice_matrix(tensor, rows: int):
    """The tensor's first `rows` weight rows as a BlockMatrix (packed as edge packs a file's tensor)."""
    from edge.kernels.block_formats import BlockMatrix

    columns, total = int(tensor.shape[0]), int(tensor.shape[1])
    rows = min(rows, total)
    data = np.array(np.asarray(tensor.data).reshape(total, -1)[:rows])  # a writable copy of the rows' bytes
    return BlockMatrix.from_file(tensor.tensor_type.name.lower(), data, rows, columns, threads=1), rows, columns


def call_seconds(kernel, matrix, columns: int, rows: list[int], repeats: int, calls: int = 100) -> dict[int, float]:
    """Median seconds of one call with R activation rows, per R, timed in rounds taking turns."""
    generator = torch.Generator().manual_seed(0)
    inputs = {r: torch.randn(r, columns, generator=generator) for r in rows}  # (R, K) each
    samples: dict[int, list[float]] = {r: [] for r in rows}
    for repeat in range(repeats + 1):  # the first round warms up
        for r in rows:
            started = time.perf_counter()
            for _ in range(calls):
                kernel.blocks(inputs[r], matrix)
            if repeat:
                samples[r].append((time.perf_counter() - started) / calls)
    return {r: statistics.median(values) for r, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a GGUF file")
    parser.add_argument("--rows", default="1,2,3,4,5,8", help="activation row counts (1 is always included)")
    parser.add_argument("--kilobytes", type=int, default=640, help="weights per call, to stay in the L2 cache")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bandwidth", type=float, default=17.5,
                        help="GB/s of weights per core for the c(R) bounds (default 17.5: 35 GB/s on 2 cores)")
    args = parser.parse_args(argv)
    from edge.kernels.cpu_kernel import CpuKernel
    from edge.kernels.cpu_paths import choose_path

    rows = sorted({1, *(int(r) for r in args.rows.split(","))})
    kernel = CpuKernel.load()
    if kernel is None:
        parser.error("edge's CPU kernel cannot be built here (it needs a C compiler with OpenMP)")
    kernel = kernel.with_threads(1)
    print(f"bench.tiles: {args.model}, path {choose_path()}, 1 thread, weights within {args.kilobytes} KB")
    print("| format | weights | one row, us | each extra row, us | extra row, GMAC/s | "
          + " | ".join(f"c({r}) bounds" for r in rows if r > 1) + " |")
    print("|---|---:|---:|---:|---:|" + "---|" * (len(rows) - 1))
    for name, tensor in tensors_by_format(args.model).items():
        bytes_per_row = np.asarray(tensor.data).reshape(int(tensor.shape[1]), -1).shape[1]
        matrix, count, columns = slice_matrix(tensor, max(FIXED_ROWS, args.kilobytes * 1024 // bytes_per_row))
        fixed_matrix, _, _ = slice_matrix(tensor, FIXED_ROWS)
        fixed = call_seconds(kernel, fixed_matrix, columns, [1], args.repeats)[1]
        seconds = {r: t - fixed for r, t in call_seconds(kernel, matrix, columns, rows, args.repeats).items()}
        extra = (seconds[rows[-1]] - seconds[1]) / (rows[-1] - 1) if len(rows) > 1 else float("nan")
        memory = matrix.nbytes / (args.bandwidth * 1e9)  # seconds to read the weights once
        bounds = []
        for r in rows[1:]:
            alone, arithmetic = max(memory, seconds[1]), seconds[r]
            overlapped, serial = max(memory, arithmetic) / alone, (memory + arithmetic) / (memory + seconds[1])
            bounds.append(f"{min(overlapped, serial):.2f}-{max(overlapped, serial):.2f}")
        print(f"| {name} | {count} x {columns}, {matrix.nbytes // 1024} KB | {seconds[1] * 1e6:.1f} | "
              f"{extra * 1e6:.1f} | {count * columns / extra / 1e9:.0f} | " + " | ".join(bounds) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
