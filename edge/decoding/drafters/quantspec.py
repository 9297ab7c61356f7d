"""QuantSpec: the target drafts for itself with 4-bit weights, reading the upper 4 bits of its hierarchical KV cache.

    engine = Engine.load(path, kv_cache="hierarchical", drafter="quantspec")     # or quantspec:8 for int8 weights

The draft is the target's architecture with every projection of its layers quantized: on the CPU for edge's kernel
(int4 in groups of 32 as --weights int4 quantizes; quantspec:8 int8 per output channel), elsewhere group-wise
(edge/kernels/quant.py); the embedding and norms are shared with the target, not copied. The head is shared where the
target's is already quantized; a 16-bit or float head, read once per drafted token, gets an 8-bit copy in blocks of
32 for the int4 draft (on a 135M model the head is a fifth of the weights). It reads the same cache the target
writes: the target sees 8 bits per value (both nibble planes), the draft only the upper plane, so there is no
second cache. The upper plane alone pays only where the cache is a large share of what a drafted token reads: while
the prefix's 8-bit keys and values are under a quarter of the draft's weight bytes (about 2,000 tokens on a 135M
model, 14,000 on a 1.1B one), the draft reads both planes, which halves nothing worth halving and keeps its
agreement with the target (on SmolLM2-135M-Instruct: 3.62 against 3.25 tokens a step at 3 drafted). Its own
keys/values for the drafted positions are written past the verified length and rewritten by the verifying pass,
as for layer-skip drafters. The target verifies in full precision, so the output is the target's (with its 8-bit KV
cache) token for token.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from edge.model.block_weights import BlockEmbedding, BlockLinear
from edge.decoding.drafters.base import Draft, DraftSampler
from edge.decoding.drafters.layer_skip import LayerSkipDrafter
from edge.errors import SamplingError
from edge.model.linears import Linear, LinearFactory
from edge.model.packed_weights import PackedLinear, widen_norms
from edge.model.transformer import Transformer, held_bytes
from edge.kernels.block_formats import QUANTIZED, BlockMatrix
from edge.kernels.quant import QuantizedLinear
from edge.kernels.runner import KernelRunner

BITS = (4, 8)  # quantspec:B, int4 in groups of 32 or int8 per output channel
UPPER_PLANE_SHARE = 0.25  # the draft reads 4-bit keys/values once their 8-bit bytes reach this share of its weights


def cpu_kernel_format(model: Transformer, bits: int, group_size: int) -> str | None:
    """The CPU kernel's packed format for a `bits`-bit draft of `model` ("int4": groups of 32, as QuantSpec's; "int8":
    per output channel), or None where the kernel cannot run it (a GPU, 16-bit compute, no C compiler)."""
    if model.device.type != "cpu" or model.dtype != torch.float32 or model.runner.matmul is None:
        return None
    return {4: "int4" if group_size == 32 else None, 8: "int8"}.get(bits)


def quantized_copy(model: Transformer, bits: int = 4, group_size: int = 32) -> Transformer:
    """The model with every projection of its layers quantized to `bits`; the embedding, norms and head are shared
    with `model` (the head is read once per step, the layers' projections are most of the bytes). On the CPU the
    projections are packed for edge's kernel (edge/model/packed_weights.py), elsewhere they are QuantizedLinear (Triton
    on a GPU, the torch reference otherwise); either takes any layer width (padded inside)."""
    packed = cpu_kernel_format(model, bits, group_size)
    # the kernel's fused step and one-call drafting run a packed draft on the target's kernel; any other on torch
    runner = KernelRunner(model.runner.matmul if packed else None, model.runner.max_rows)
    draft = Transformer(model.config, device="meta", linears=LinearFactory(runner))
    shared = {name: tensor for name, tensor in model.state_dict().items() if not name.endswith(".packed")}
    draft.load_state_dict(shared, strict=False, assign=True)  # shares the tensors, copies nothing
    if isinstance(model.embed, BlockEmbedding):  # a GGUF file's embedding and head in their blocks: shared as they are
        draft.embed, draft.lm_head, draft.packed_head = model.embed, model.lm_head, model.packed_head
    draft.inv_freq, draft.inv_freq_local = model.inv_freq, model.inv_freq_local  # the meta ones held no data
    draft.compute_dtype = model.compute_dtype  # float32 activations over 16-bit weights, as the target computes
    streamer = getattr(model, "streamer", None)
    for index, layer in enumerate(draft.layers):
        source_layer = model.layers[index]
        if streamer is not None and index in streamer.host:  # an offloaded layer: quantized from its host copy
            layer.load_state_dict({name: tensor.to(model.device) for name, tensor in streamer.host[index].items()},
                                  assign=True)
            source_layer = layer
        _quantize_projections(layer, source_layer, packed, draft.linears, bits, group_size)
    if packed:  # float32 norms beside packed matrices, as the target's
        widen_norms(draft)
        if packed == "int4" and not _quantized_head(model):
            draft.packed_head = BlockMatrix.quantized("q8_0", model.head_weight)  # (V, D) in 8-bit blocks
        # else the head stays the target's (packed_head): already quantized
    return draft.eval().requires_grad_(False)


def _quantize_projections(layer: nn.Module, source_layer: nn.Module, packed: str | None, linears: LinearFactory,
                          bits: int, group_size: int) -> None:
    """Replace each projection of the draft's `layer` by `source_layer`'s, quantized (packed for the CPU kernel
    where `packed` names its format)."""
    for name, module in list(layer.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, Linear):
                continue
            source = source_layer.get_submodule(f"{name}.{child_name}" if name else child_name)  # float or packed
            if packed == "int4":
                setattr(module, child_name, linears.int4(source))
            elif packed:
                setattr(module, child_name, linears.packed(source, packed))
            elif isinstance(source, PackedLinear):  # only QuantSpec's own group size keeps a packed target's kernel
                raise SamplingError("the quantspec drafter of an int8/int4 target runs on edge's CPU kernel, with "
                                    "groups of 32: use --drafter quantspec or quantspec:8")
            else:
                setattr(module, child_name, QuantizedLinear.from_linear(source, bits, group_size))


def _quantized_head(model: Transformer) -> bool:
    """Whether `model`'s head is already in a quantized format (int8-packed, or blocks of a quantized GGUF type)."""
    head = model.packed_head
    if isinstance(head, BlockMatrix):
        return all(name in QUANTIZED for name in head.formats)
    return head is not None


class QuantSpecDrafter(LayerSkipDrafter):
    """A layer-skip drafter that runs every layer of the quantized copy, reading the cache's draft view."""

    def __init__(self, target: Transformer, cache, bits: int = 4, group_size: int = 32) -> None:
        if bits not in BITS:
            raise SamplingError(f"the quantspec drafter quantizes to 4 or 8 bits, not {bits}: use --drafter quantspec "
                                "(int4) or quantspec:8")
        if getattr(cache, "formats", None) != ("hierarchical", "hierarchical"):
            raise SamplingError("the quantspec drafter reads the upper 4 bits of a hierarchical KV cache; load the "
                                "model with kv_cache='hierarchical' (edge-chat --kv-cache hierarchical)")
        # all layers as a partial pass: it writes past the verified length and does not advance cache.length
        super().__init__(quantized_copy(target, bits, group_size), cache, list(range(target.config.num_layers)),
                         f"quantspec:{bits}")
        self.own_head = self.model.packed_head is not target.packed_head  # an 8-bit copy of a float head
        config = target.config  # one position's 8-bit keys and values: codes, a float16 step and low per vector
        self._kv_bytes_per_token = 2 * config.num_layers * config.num_kv_heads * (config.head_dim + 4)
        self.upper_plane_from = int(UPPER_PLANE_SHARE * self._bytes_per_drafted_token() / self._kv_bytes_per_token)

    def _bytes_per_drafted_token(self) -> int:
        """What one drafted token reads besides the cache: the layers' quantized projections and the head."""
        head = self.model.packed_head
        head_bytes = head.nbytes if head is not None else self.model.head_weight.nbytes
        return held_bytes([self.model.layers]) + head_bytes

    def reads_upper_plane(self, context: int) -> bool:
        """Whether a draft at `context` tokens reads the cache's upper 4 bits alone (else both planes)."""
        return context >= self.upper_plane_from

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        with self.cache.drafting() if self.reads_upper_plane(len(tokens)) else nullcontext():
            return super().propose(tokens, k, sampler)

    def memory_bytes(self) -> int:
        """The quantized projections (the rest is the target's), and a trimmed head if any."""
        quantized = sum(m.quantized.nbytes for m in self.model.modules() if isinstance(m, QuantizedLinear))
        quantized += sum(m.packed.nbytes for m in self.model.modules() if isinstance(m, PackedLinear))
        quantized += sum(m.matrix.nbytes for m in self.model.layers.modules() if isinstance(m, BlockLinear))
        if self.own_head:
            quantized += self.model.packed_head.nbytes
        return quantized + super().memory_bytes()
