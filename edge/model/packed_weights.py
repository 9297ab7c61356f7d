"""int8 and int4 weights on the CPU: each layer's four matrices and the head quantized at load, run by edge's kernel
on every row count, prompts included.

    model = load_model(path)                  # float32 compute, 16- or 32-bit weights
    quantize_weights(model, "int4")           # wqkv, wo, w_gate_up, w_down quantized; norms float32; the head too
    model(tokens, start, cache)

    int8  per output channel, activations quantized per row (w8a8; edge/kernels/csrc/matmul_int8.c): a quarter of
          float32's bytes. The head gets a packed copy; the embedding stays as loaded.
    int4  4-bit codes with a searched scale and minimum per 32 inputs (5 bits a weight: llama.cpp's Q4_1 layout,
          edge/kernels/csrc/blocks_quantize.c), run by the block kernel (edge/model/block_weights.py) with activations per
          block of 32 (w4a8). The head in 8-bit blocks (Q8_0): a 4-bit head costs a small model most of int4's
          loss. The embedding stays as loaded (its rows are looked up; a feature drafter reads the same rows).

Both sum exactly in integers and finish with the same float steps for every row count and CPU path, so a verify pass
reproduces decode steps bit for bit and greedy speculation on a quantized model equals its own plain decoding. A
quantized model is a different model from the float one (docs/benchmarks.md measures how far): compare its
speculative output with its own plain decoding. Any shape quantizes: outputs are padded to 16 and inputs to 4 (int8)
or 32 (int4) with zero weights.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.errors import UnsupportedModelError
from edge.model.block_weights import BlockLinear
from edge.kernels.block_formats import BlockMatrix, PackedArena, packed_bytes
from edge.kernels.cpu_packing import dequantize, pack_int8

FORMATS = ("int8", "int4")
PROJECTIONS = (("attn", "wqkv"), ("attn", "wo"), ("ffn", "w_gate_up"), ("ffn", "w_down"))


class PackedLinear(nn.Module):
    """A linear layer with weights packed for edge's CPU kernel (`format` "int8"), run by the kernel for every row
    count through its model's `runner` (edge/kernels/runner.py; edge/model/linears.py LinearFactory.packed makes them)."""

    def __init__(self, packed: torch.Tensor, fmt: str, in_features: int, out_features: int,
                 bias: torch.Tensor | None, runner) -> None:
        super().__init__()
        self.format, self.in_features, self.out_features = fmt, in_features, out_features
        self.packed = nn.Parameter(packed, requires_grad=False)  # uint8 bytes (edge/kernels/cpu_packing.py)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)  # (N,)
        self.runner = runner

    @property
    def weight(self) -> torch.Tensor:
        """The float32 values (N, K) the codes stand for (made on each call: for re-quantizing)."""
        return dequantize(self.packed.data, self.format, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., K) float32 -> (..., N) float32 (quantize_weights only takes models computing in float32)
        return self.runner.quantized(x, self.packed, self.format, self.out_features, self.bias)

    def extra_repr(self) -> str:
        return f"{self.format}, in_features={self.in_features}, out_features={self.out_features}"


def quantization_problem(model, fmt: str) -> str | None:
    """None when `quantize_weights(model, fmt)` can run, else why not (one line)."""
    if fmt not in FORMATS:
        return f"weights {fmt!r}: the load-time quantizations are {', '.join(FORMATS)}"
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"{fmt} weights need a CPU model computing in float32 (--dtype float32, the default)"
    if model.runner.matmul is None:
        return (f"{fmt} weights run on edge's CPU kernel, which is not available here (it needs a C compiler with "
                "OpenMP)")
    current = packed_format(model)
    if current not in (None, fmt, "blocks"):
        return f"this model's weights are already {current}; load it again to quantize to {fmt}"
    return None


def packed_format(model) -> str | None:
    """The format `model`'s layers are packed in: "int8" (PackedLinear), "blocks" (BlockLinear: a GGUF file's own
    types, or edge's int4), None for float (or otherwise quantized) ones. Read off the first layer that holds its
    projections (an offloaded one does not)."""
    for block in model.layers:
        wqkv = getattr(getattr(block, "attn", None), "wqkv", None)
        if isinstance(wqkv, PackedLinear):
            return wqkv.format
        if wqkv is not None:
            return "blocks" if isinstance(wqkv, BlockLinear) else None
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
    """Quantize each layer's four matrices to `fmt` and widen its norms to float32, in place, with a quantized copy of
    the head (`model.packed_head`, which logits() and one-call drafting then use). int8: PackedLinear and an int8 head.
    int4: BlockLinear (edge/model/block_weights.py) and an 8-bit block head; the model's format is then "blocks"."""
    problem = quantization_problem(model, fmt)
    if problem is not None:
        raise UnsupportedModelError(problem)
    if fmt == "int4":
        _quantize_int4(model)
    else:
        for block in model.layers:
            for owner, name in PROJECTIONS:
                linear = getattr(getattr(block, owner), name)
                if not isinstance(linear, PackedLinear):
                    setattr(getattr(block, owner), name, model.linears.packed(linear, fmt))
        model.packed_head = pack_int8(model.head_weight)  # (V, D) packed; the embedding keeps its rows for lookups
    widen_norms(model)
    model.runner.weights_changed()  # the pointers change: found again at the next forward


def _quantize_int4(model) -> None:
    """The layers in 4-bit blocks and a copy of the head in 8-bit blocks, packed into one arena on huge pages; the
    embedding stays as loaded."""
    config = model.config
    linears = [getattr(getattr(block, owner), name) for block in model.layers for owner, name in PROJECTIONS]
    size = sum(packed_bytes("q4_1", linear.out_features, linear.in_features) for linear in linears)
    size += packed_bytes("q8_0", config.vocab_size, config.hidden_size)
    arena = PackedArena(size + PackedArena.ALIGN * (len(linears) + 1))
    for block in model.layers:
        for owner, name in PROJECTIONS:
            setattr(getattr(block, owner), name, model.linears.int4(getattr(getattr(block, owner), name), arena))
    model.packed_head = BlockMatrix.quantized("q8_0", model.head_weight, arena=arena)  # (V, D)
    model.compute_dtype = torch.float32
