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

import torch

from edge.drafters.base import Draft, DraftSampler, draft_autoregressively
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


class QuantSpecDrafter:
    def __init__(self, target: Transformer, cache, bits: int = 4, group_size: int = 32) -> None:
        if getattr(cache, "formats", None) != ("hierarchical", "hierarchical"):
            raise SamplingError("the quantspec drafter reads the upper 4 bits of a hierarchical KV cache; load the "
                                "model with kv_cache='hierarchical' (edge-chat --kv-cache hierarchical)")
        self.name = f"quantspec:{bits}"
        self.target, self.cache = target, cache
        self.draft = quantized_copy(target, bits, group_size)
        self.layers = list(range(target.config.num_layers))  # a partial pass: it does not advance cache.length
        self.device = target.device

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        with self.cache.drafting():
            return draft_autoregressively(self._step, tokens, [tokens[-1]], len(tokens) - 1, k, sampler)

    def _step(self, feed: list[int], start: int) -> torch.Tensor:
        hidden = self.draft(torch.tensor([feed], device=self.device), start, self.cache, layers=self.layers)
        return self.draft.logits(hidden[:, -1:])[0, -1]  # (V,)

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        pass

    def reset(self) -> None:
        pass

    def memory_bytes(self) -> int:
        """The quantized projections (the rest is the target's)."""
        return sum(m.quantized.nbytes for m in self.draft.modules() if isinstance(m, QuantizedLinear))
