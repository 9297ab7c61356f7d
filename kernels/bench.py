"""Kernel benchmark: achieved memory bandwidth of the Triton kernels against the GPU's measured copy bandwidth.

    python -m kernels.bench [--n 8192 --k 8192 --group 128]

Measured bandwidth is a large device-to-device copy (bytes read + written per second). The int4 GEMV (one row of x)
is bound by reading its codes and scales; its GB/s counts those bytes plus x and y. Needs a CUDA GPU of compute
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--group", type=int, default=128)
    args = parser.parse_args(argv)
    from kernels.dispatch import MIN_CAPABILITY

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_CAPABILITY:
        print("kernels.bench: needs a CUDA GPU of compute capability 8.0 or newer; nothing was measured",
              file=sys.stderr)
        return 2
    from kernels.quant import quantize_weight
    from kernels.triton_kernels import quantized_matmul

    source = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    copy_ms = timed_ms(lambda: target.copy_(source))
    bandwidth = 2 * source.nbytes / (copy_ms / 1e3) / 1e9
    weight = quantize_weight(torch.randn(args.n, args.k, device="cuda"), bits=4, group_size=args.group)
    x = torch.randn(1, args.k, device="cuda")
    gemv_ms = timed_ms(lambda: quantized_matmul(x, weight))
    moved = weight.nbytes + x.nbytes + args.n * 4
    achieved = moved / (gemv_ms / 1e3) / 1e9
    report = {"device": torch.cuda.get_device_name(), "copy_bandwidth_gb_s": round(bandwidth, 1),
              "int4_gemv": {"n": args.n, "k": args.k, "group": args.group, "ms": round(gemv_ms, 4),
                            "gb_s": round(achieved, 1), "share_of_bandwidth": round(achieved / bandwidth, 3)}}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
