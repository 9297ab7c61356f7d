"""int8 and int4 weights on the CPU: each layer's four matrices and the head quantized at load, run by edge's kernel
(kernels/csrc/matmul_int8.c, matmul_int4.c) on every row count, prompts included.

    model = load_model(path)                  # float32 compute, 16- or 32-bit weights
    quantize_weights(model, "int4")           # wqkv, wo, w_gate_up, w_down -> PackedLinear; norms float32; the head
    model(tokens, start, cache)

    int8  per output channel, activations quantized per row (w8a8): a quarter of float32's bytes
    int4  groups of 32 inputs with a float16 scale each (4.5 bits a weight), activations per block of 32 (w4a8):
          about half of int8's bytes

Both sum exactly in integers and finish with the same float steps for every row count and CPU path, so a verify pass
reproduces decode steps bit for bit and greedy speculation on a quantized model equals its own plain decoding. A
quantized model is a different model from the float one (int8 moves logits by about 1%, int4 by several): compare
its speculative output with its own plain decoding. The embedding stays as loaded (its rows are looked up); the head
gets a packed copy (the embedding's rows stay for lookups when the two are tied). Any matrix shape packs: the kernel
pads outputs to 16 and inputs to 4 (int8) or 32 (int4) with zero weights.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.errors import UnsupportedModelError
from kernels.cpu_matmul import ROWWISE_MAX_ROWS
from kernels.cpu_packing import dequantize, pack_int4, pack_int8

FORMATS = ("int8", "int4")


def _packer(fmt: str):
    return {"int8": pack_int8, "int4": pack_int4}[fmt]


class PackedLinear(nn.Module):
    """A linear layer with weights packed for edge's CPU kernel (`format` "int8" or "int4"), run by the kernel for
    every row count. `max_rows` is the float layers' limit, which the attention beside it also reads."""

    max_rows = ROWWISE_MAX_ROWS

    def __init__(self, packed: torch.Tensor, fmt: str, in_features: int, out_features: int,
                 bias: torch.Tensor | None, rowwise) -> None:
        super().__init__()
        self.format, self.in_features, self.out_features = fmt, in_features, out_features
        self.packed = nn.Parameter(packed, requires_grad=False)  # uint8 bytes (kernels/cpu_packing.py)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)  # (N,)
        self.rowwise = rowwise

    @classmethod
    def from_linear(cls, linear: nn.Module, fmt: str, rowwise) -> "PackedLinear":
        """From a float Linear, or from another PackedLinear or a BlockLinear (re-quantizing what its codes stand
        for)."""
        if isinstance(linear, PackedLinear):
                    weight = dequantize(linear.packed.data, linear.format, linear.out_features, linear.in_features)
        else:
            weight = linear.weight
        return cls(_packer(fmt)(weight), fmt, linear.in_features, linear.out_features, linear.bias, rowwise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., K) float32 -> (..., N) float32 (quantize_weights only takes models computing in float32)
        return self.rowwise.quantized(x, self.packed, self.format, self.out_features, self.bias)

    def extra_repr(self) -> str:
        return f"{self.format}, in_features={self.in_features}, out_features={self.out_features}"


def quantization_problem(model, fmt: str) -> str | None:
    """None when `quantize_weights(model, fmt)` can run, else why not (one line)."""
    if fmt not in FORMATS:
        return f"weights {fmt!r}: the load-time quantizations are {', '.join(FORMATS)}"
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"{fmt} weights need a CPU model computing in float32 (--dtype float32, the default)"
    if getattr(model, "rowwise", None) is None:
        return (f"{fmt} weights run on edge's CPU kernel, which is not available here (it needs a C compiler with "
                "OpenMP)")
    if model.packed_format not in (None, fmt, "blocks"):
        return f"this model's weights are already {model.packed_format}; load it again to quantize to {fmt}"
    return None


def widen_norms(model) -> None:
    """Every RMSNorm weight of `model` in float32 (a new tensor only where it is narrower), as the kernel reads them
    beside packed matrices."""
    norms = [model.norm] + [norm for block in model.layers
                            for norm in (block.attn_norm, block.ffn_norm, block.attn.q_norm, block.attn.k_norm)]
    for norm in norms:
        if norm is not None:
            norm.weight = nn.Parameter(norm.weight.detach().float(), requires_grad=False)


def quantize_weights(model, fmt: str) -> None:
    """Replace each layer's four matrices by PackedLinear in `fmt`, widen its norms to float32 and pack a copy of the
    head (`model.packed_head`, which logits() and one-call drafting then use), in place."""
    problem = quantization_problem(model, fmt)
    if problem is not None:
        raise UnsupportedModelError(problem)
    for block in model.layers:
        for owner, name in ((block.attn, "wqkv"), (block.attn, "wo"), (block.ffn, "w_gate_up"), (block.ffn, "w_down")):
            linear = getattr(owner, name)
            if not isinstance(linear, PackedLinear):
                setattr(owner, name, PackedLinear.from_linear(linear, fmt, model.rowwise))
    widen_norms(model)
    model.packed_head = _packer(fmt)(model.head_weight)  # (V, D) packed; the embedding keeps its rows for lookups
    model.packed_format = fmt
    model._fused_weights = None  # the pointers change: found again at the next forward
