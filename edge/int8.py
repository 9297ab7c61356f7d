"""int8 weights on the CPU (w8a8): each layer's four matrices quantized per output channel at load, activations
quantized per row inside edge's kernel (kernels/csrc/rowwise_matmul.c, `rowwise_matmul_i8`, VNNI dot products).

    model = load_model(path)            # float32 compute, 16- or 32-bit weights
    quantize_int8(model)                # wqkv, wo, w_gate_up, w_down -> Int8Linear; norms float32
    model(tokens, start, cache)         # every row count, prefill included, through the int8 kernel

Half the bytes of float16 per step and a quarter of the multiply-add instructions (64 per VNNI instruction against
16 for float32): a decode call of the built-in model is about 1.7x faster. An extra verify row still costs its
attention and the rest of a layer's per-row work, so relative to the faster step verify rows cost more and
speculation gains less on an int8 model (docs/benchmarks.md, session 8). Each row is quantized
and summed alone, in exact integer arithmetic: like the float kernels the results do not depend on how many rows
share a call, so greedy speculation stays exactly equal to plain decoding on the int8 model. The int8 model is a
different model from the float one (its logits move by about 1%): compare its speculative output with its own plain
decoding. The embedding stays as loaded; the head gets a packed int8 copy (the embedding's rows stay for lookups
when the two are tied).
"""

from __future__ import annotations

import torch
from torch import nn

from edge.errors import UnsupportedModelError
from edge.model import ROWWISE_MAX_ROWS


class Int8Linear(nn.Module):
    """A linear layer with packed int8 weights (kernels.cpu_matmul.pack_int8), run by edge's CPU kernel for every row
    count. `max_rows` is the float layers' limit, which the attention beside it also reads."""

    max_rows = ROWWISE_MAX_ROWS

    def __init__(self, packed: torch.Tensor, in_features: int, out_features: int, bias: torch.Tensor | None,
                 rowwise) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.packed = nn.Parameter(packed, requires_grad=False)  # (N*K + 8N,) uint8
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)  # (N,)
        self.rowwise = rowwise

    @classmethod
    def from_linear(cls, linear: nn.Linear, rowwise) -> "Int8Linear":
        from kernels.cpu_matmul import pack_int8

        return cls(pack_int8(linear.weight), linear.in_features, linear.out_features, linear.bias, rowwise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., K) float32 -> (..., N) float32 (quantize_int8 only takes models computing in float32)
        return self.rowwise.int8(x, self.packed, self.out_features, self.bias)


def int8_problem(model) -> str | None:
    """None when `quantize_int8` can run on this model, else why not (one line)."""
    from kernels.cpu_matmul import int8_supported

    if model.device.type != "cpu" or model.dtype != torch.float32:
        return "int8 weights need a CPU model computing in float32 (--dtype float32, the default)"
    if getattr(model, "rowwise", None) is None:
        return "int8 weights run on edge's CPU kernel, which is not available here (it needs a C compiler with OpenMP)"
    for block in model.layers:
        for linear in (block.attn.wqkv, block.attn.wo, block.ffn.w_gate_up, block.ffn.w_down):
            if not isinstance(linear, Int8Linear) and not int8_supported(linear.weight):
                return (f"int8 weights need matrix sizes divisible by 16 (outputs) and 4 (inputs); this model has "
                        f"{tuple(linear.weight.shape)}")
    return None


def quantize_int8(model) -> None:
    """Replace each layer's four matrices by Int8Linear, widen its norms to float32 and pack an int8 copy of the head
    (`model.int8_head`, which logits() and one-call drafting then use), in place."""
    from kernels.cpu_matmul import int8_supported, pack_int8

    problem = int8_problem(model)
    if problem is not None:
        raise UnsupportedModelError(problem)
    for block in model.layers:
        for owner, name in ((block.attn, "wqkv"), (block.attn, "wo"), (block.ffn, "w_gate_up"), (block.ffn, "w_down")):
            linear = getattr(owner, name)
            if not isinstance(linear, Int8Linear):
                setattr(owner, name, Int8Linear.from_linear(linear, model.rowwise))
        for norm in (block.attn_norm, block.ffn_norm, block.attn.q_norm, block.attn.k_norm):
            if norm is not None:
                norm.weight = nn.Parameter(norm.weight.detach().float(), requires_grad=False)
    model.norm.weight = nn.Parameter(model.norm.weight.detach().float(), requires_grad=False)
    head = model.head_weight  # (V, D); the embedding keeps its rows for lookups
    model.int8_head = pack_int8(head) if int8_supported(head) else None
    model.int8 = True
    model._fused_weights = None  # the pointers change: found again at the next forward
