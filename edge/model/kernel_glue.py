"""Where edge's model meets its kernel runner: a Transformer read as the plain tensors edge/kernels/runner.py takes, and
the model-level calls that go through the runner.

    use_kernel(model, CpuKernel.load())        # bind the model's runner (every projection follows), checked
    draft_greedy(model, DraftRequest(...))     # k greedy draft tokens in one C call, or None (draft step by step)
    verifies_trees(model, cache)               # whether a token tree's verify pass runs here
    kernel_head(model, rows)                   # the model's head as the fused calls score with it

The decisions live in kernels/runner.py (KernelRunner, FusedWeights) and the C calls in kernels/cpu_kernel.py
(CpuKernel), which import nothing from edge; this module only knows where a Transformer keeps its tensors
(ModelTensors) and hands them over.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.errors import UnsupportedModelError
from edge.model.block_weights import BlockEmbedding, BlockLinear
from edge.model.linears import Linear
from edge.model.packed_weights import PackedLinear, packed_format
from edge.kernels.block_formats import BlockMatrix
from edge.kernels.cpu_kernel import CpuKernel
from edge.kernels.records import DraftRequest, KernelDraft, KernelHead, LayerTable, ModelEnds

# the config's gate activations by the fused calls' names (cpu_kernel.ACTIVATIONS, from the C header)
KERNEL_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


class ModelTensors:
    """A Transformer as its kernel runner reads it (the members edge/kernels/runner.py lists), made per call: nothing is
    copied, every member reads the model as it is now."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def shape(self):
        return self.model.config.shape()  # edge.memory.footprint.ModelShape

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def rope(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.rope(start, end, torch.float32, local=None)  # cos, sin (T, W) each: every kind's tables

    def ends(self, head: KernelHead | None = None) -> ModelEnds:
        """The embedding, final norm and `head` (default: the model's) as a whole pass in one C call reads them."""
        model, config = self.model, self.model.config
        head = head if head is not None else kernel_head(model)
        scales = dict(embed_scale=config.embedding_scale, softcap=config.final_logit_softcapping)
        if isinstance(model.embed, BlockEmbedding):
            return ModelEnds(model.embed.table_entry, model.norm.weight, head, embed_format="blocks", **scales)
        return ModelEnds(model.embed.weight, model.norm.weight, head, **scales)

    def layer_table(self) -> LayerTable | None:
        """The layers handed to the fused C calls, or None where one is not a block of Linear projections (PackedLinear
        or BlockLinear ones when packed) or holds weights the kernel does not read (offloaded, QuantizedLinear). Every
        family's layers are read: beside the Llama layout's, Gemma 3's (sandwich norms, GeGLU, local layers with their
        own window and rotary table, the scores' scale) and Phi-3's (partial rotary; LongRoPE is in the tables)."""
        config = self.model.config
        layers, fmt = self.model.layers, packed_format(self.model)
        matrix_type, matrix = {"blocks": (BlockLinear, "table_entry"), None: (Linear, "weight")}.get(
            fmt, (PackedLinear, "packed"))
        tensors = [_layer_tensors(block, matrix_type, matrix) for block in layers]
        if None in tensors:
            return None
        every = range(config.num_layers)
        # replaced when the last layer, or its first matrix, is not the one the pointers were taken from
        wqkv = layers[-1].attn.wqkv
        slots = wqkv._buffers if matrix == "table_entry" else wqkv._parameters
        return LayerTable(tensors, [config.window(i) or 0 for i in every], fmt,
                          watch=((layers._modules, str(len(layers) - 1)), (slots, matrix)),
                          rope_tables=[int(config.local_rope(i)) for i in every], rotary_dim=config.rotary_dim,
                          activation=KERNEL_ACTIVATIONS[config.activation], scale=config.attention_scale)


def _layer_tensors(block: nn.Module, matrix_type: type, matrix: str) -> dict | None:
    """A decoder layer's tensors by the fused C table's slot names (edge.kernels.cpu_kernel.SLOTS, from the C header),
    None where one is absent; the matrices are the tensors named `matrix` of its four `matrix_type` projections. None
    for a layer that does not hold its projections (an offloaded one) or holds another kind."""
    attn, ffn = getattr(block, "attn", None), getattr(block, "ffn", None)
    if attn is None or ffn is None:
        return None
    projections = (attn.wqkv, attn.wo, ffn.w_gate_up, ffn.w_down)
    if not all(isinstance(m, matrix_type) for m in projections):
        return None
    wqkv, wo, gate_up, down = (getattr(m, matrix) for m in projections)
    q_norm, k_norm, post_attn_norm, post_ffn_norm = (
        norm.weight if norm is not None else None
        for norm in (attn.q_norm, attn.k_norm, block.post_attn_norm, block.post_ffn_norm))
    return {"attn_norm": block.attn_norm.weight, "wqkv": wqkv, "qkv_bias": attn.wqkv.bias, "q_norm": q_norm,
            "k_norm": k_norm, "wo": wo, "o_bias": attn.wo.bias, "post_attn_norm": post_attn_norm,
            "ffn_norm": block.ffn_norm.weight, "w_gate_up": gate_up, "gate_up_bias": ffn.w_gate_up.bias,
            "w_down": down, "down_bias": ffn.w_down.bias, "post_ffn_norm": post_ffn_norm}


def kernel_head(model: nn.Module, rows: int | None = None) -> KernelHead:
    """`model`'s head as the fused C calls read it: the packed one when there is one and every row is wanted (as
    logits() does), else the leading `rows` float rows (a draft vocabulary padded beyond the target's)."""
    vocab, packed = model.config.vocab_size, model.packed_head
    if isinstance(packed, BlockMatrix) and rows in (None, vocab):
        return KernelHead(packed.table_entry, vocab, packed_format="blocks")
    if packed is not None and rows in (None, vocab):
        return KernelHead(packed, vocab, packed_format=packed_format(model))
    weight = model.head_weight if rows is None else model.head_weight[:rows]  # (V', D): leading rows, contiguous
    return KernelHead(weight, weight.shape[0])


def use_kernel(model: nn.Module, matmul: CpuKernel | None, max_rows: int | None = None) -> None:
    """Run `model` on `matmul` (None: torch's matmul throughout), passes of up to `max_rows` rows (default: as now)
    batch-invariant, where the kernel reads every float projection's weights; else on torch. Packed weights run only
    on the kernel: without it they are an error."""
    linears = [module for module in model.modules() if isinstance(module, Linear)]
    supported = matmul is not None and all(matmul.supports(m.weight, m.bias) for m in linears)
    fmt = packed_format(model)
    if fmt and not supported:
        raise UnsupportedModelError(f"this model's {fmt} weights run only on edge's CPU kernel; keep it on the CPU")
    model.runner.use(matmul if supported else None, max_rows)


def draft_greedy(model: nn.Module, request: DraftRequest) -> KernelDraft | None:
    """request.k greedy draft tokens from `model` in one C call (edge/kernels/records.py DraftRequest), or None where that
    path is not available (then the caller drafts step by step)."""
    return model.runner.draft(ModelTensors(model), request)


def verifies_trees(model: nn.Module, cache, rows: int = 2) -> bool:
    """Whether a token tree of `rows` rows can be verified in one pass (Transformer.forward_logits(parents=...)): the
    fused CPU step over this cache."""
    return model.runner.verifies_trees(ModelTensors(model), cache, rows)


def step_rows(model: nn.Module, tokens: torch.Tensor, slots: torch.Tensor, firsts: torch.Tensor,
              cache) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Several sequences' rows in one fused pass over one cache whose regions they own (KernelRunner.step_rows):
    tokens, slots, firsts (T,) int64 -> hidden (T, D), logits (T, V); None where the fused CPU step cannot run it."""
    return model.runner.step_rows(ModelTensors(model), tokens, slots, firsts, cache)
