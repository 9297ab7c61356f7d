"""Which implementation runs a quantized operation: the Triton kernel on a capable GPU, the torch reference elsewhere.

    quantized_linear(x, weight, bias)      edge/kernels/triton_kernels.quantized_matmul or the dequantizing reference
    use_triton(tensor)                     the decision, for callers and tests

Triton needs a CUDA GPU of compute capability 8.0 or newer (sm_80+: A100, RTX 30xx and later, H100/H200). On an
older GPU the reference path runs and one notice says so. TRITON_INTERPRET=1 (set before triton is imported) runs
the Triton kernels on the CPU, slowly; EDGE_TRITON_ON_CPU=1 then routes CPU tensors to them. Tests use both to
check the kernels in CI, where there is no GPU.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache

import torch
import torch.nn.functional as F

from edge.kernels.quant_weight import QuantizedWeight

MIN_CAPABILITY = (8, 0)
log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Triton kernels may run on CPU tensors: the interpreter is on and CPU dispatch was asked for."""
    return os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("EDGE_TRITON_ON_CPU") == "1"


def use_triton(tensor: torch.Tensor) -> bool:
    if not triton_importable():
        return False
    if tensor.device.type == "cuda":
        return _capable(tensor.device.index or 0)
    return interpreting()


@lru_cache(maxsize=None)
def _capable(device: int) -> bool:
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        log.warning("GPU %d has compute capability %d.%d; edge's Triton kernels need %d.%d, so the quantized paths "
                    "run through the (slower) torch reference", device, *capability, *MIN_CAPABILITY)
        return False
    return True


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ dequant(weight).T (+ bias) -> (..., N)."""
    if use_triton(x):
        from edge.kernels.triton_kernels import quantized_matmul

        out = quantized_matmul(x, weight).to(x.dtype)
        return out if bias is None else out + bias
    return F.linear(x, weight.dequantize().to(x.dtype), bias)
