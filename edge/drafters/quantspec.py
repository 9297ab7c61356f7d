"""QuantSpec: the target drafts for itself with 4-bit weights, reading the upper 4 bits of its hierarchical KV cache.

    engine = Engine.load(path, kv_cache="hierarchical", drafter="quantspec")     # or quantspec:8 for int8 weights

The draft is the target's architecture with every projection of its layers quantized group-wise (kernels/quant.py);
the embedding, norms and head are shared with the target, not copied. It reads the same cache the target
writes: the target sees 8 bits per value (both nibble planes), the draft only the upper plane, so there is no
second cache. Its own keys/values for the drafted positions are written past the verified length and rewritten by
the verifying pass, as for layer-skip drafters. The target verifies in full precision, so the output is the
target's (with its 8-bit KV cache) token for token.
"""

from __future__ import annotations

from edge.drafters.base import Draft, DraftSampler
from edge.drafters.layer_skip import LayerSkipDrafter
from edge.errors import SamplingError
from edge.model import Linear, Transformer
from kernels.quant import QuantizedLinear


def quantized_copy(model: Transformer, bits: int = 4, group_size: int = 32) -> Transformer:
    """The model with every projection of its layers replaced by a QuantizedLinear; the embedding, norms and head
    are shared with `model` (the head is read once per step, the layers' projections are most of the bytes)."""
    draft = Transformer(model.config, device="meta")
    draft.load_state_dict(model.state_dict(), strict=True, assign=True)  # shares the tensors, copies nothing
    draft.inv_freq = model.inv_freq
    for module in list(draft.layers.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, Linear):
                setattr(module, child_name, QuantizedLinear.from_linear(child, bits, group_size))
    return draft.eval().requires_grad_(False)


class QuantSpecDrafter(LayerSkipDrafter):
    """A layer-skip drafter that runs every layer of the quantized copy, reading the cache's draft view."""

    def __init__(self, target: Transformer, cache, bits: int = 4, group_size: int = 32) -> None:
        if getattr(cache, "formats", None) != ("hierarchical", "hierarchical"):
            raise SamplingError("the quantspec drafter reads the upper 4 bits of a hierarchical KV cache; load the "
                                "model with kv_cache='hierarchical' (edge-chat --kv-cache hierarchical)")
        # all layers as a partial pass: it writes past the verified length and does not advance cache.length
        super().__init__(quantized_copy(target, bits, group_size), cache, list(range(target.config.num_layers)),
                         f"quantspec:{bits}")

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        with self.cache.drafting():
            return super().propose(tokens, k, sampler)

    def memory_bytes(self) -> int:
        """The quantized projections (the rest is the target's), and a trimmed head if any."""
        quantized = sum(m.quantized.nbytes for m in self.model.modules() if isinstance(m, QuantizedLinear))
        return quantized + super().memory_bytes()
