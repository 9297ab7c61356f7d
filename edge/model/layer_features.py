"""The target's residual streams at a few layers, kept for every position a full pass computes: what an EAGLE-3
drafter drafts from (edge/decoding/drafters/eagle3.py), on the torch path and in the fused C calls alike.

    kept = keep_layer_features(model, (1, 13, 24), max_len)   # from now on every full pass of batch 1 keeps them
    kept.rows[p]                                               # (n * D,): position p's streams side by side
    features = layer_features(model, tokens, (1, 13, 24))      # (T, n * D) of a token sequence: what a trainer calls

A layer id j names the residual stream leaving decoder layer j (0-based): the input of layer j + 1, which is
Hugging Face's `hidden_states[j + 1]`. EAGLE-3's default, the streams entering layers 2, L // 2 and L - 3 (SafeAILab's
EAGLE, vLLM and SGLang capture them before those layers run), is `default_layers(L)` = (1, L // 2 - 1, L - 4).

Like the KV cache, the rows of rejected drafts are rewritten by the next full pass, and a token tree's rows are moved
into place by keep_rows (edge.model.transformer); positions below cache.length always hold this sequence's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edge.kernels.records import LayerCapture


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers of a target with `num_layers` layers, as layer ids (see above); a target
    of fewer than 5 layers gets them clamped into its range."""
    return tuple(min(max(layer, 0), num_layers - 1) for layer in (1, num_layers // 2 - 1, num_layers - 4))


@dataclass
class LayerFeatures:
    """The streams after `layers` of every position: rows (max_len, n * D), stream c of position p at
    rows[p, c * D:(c + 1) * D]; `order` the same ids as an int64 tensor for the C calls."""

    layers: tuple[int, ...]
    rows: torch.Tensor
    order: torch.Tensor

    @property
    def width(self) -> int:
        return self.rows.shape[1] // len(self.layers)

    def fits(self, end: int, batch: int) -> bool:
        """Whether a full pass up to position `end` of `batch` sequences is kept (one sequence, within the rows)."""
        return batch == 1 and end <= self.rows.shape[0]

    def capture(self, start: int, end: int) -> LayerCapture:
        """What the fused C calls write for positions [start, end) (or a tree's slots there)."""
        return LayerCapture(self.order, self.rows[start:end])

    def write(self, layer: int, start: int, x: torch.Tensor) -> None:
        """On the torch path: x (1, T, D), the stream after `layer`, into its columns of [start, start + T)."""
        width = self.width
        for c, kept in enumerate(self.layers):
            if kept == layer:
                self.rows[start:start + x.shape[1], c * width:(c + 1) * width] = x[0]


def keep_layer_features(model, layers: tuple[int, ...], max_len: int) -> LayerFeatures:
    """From now on `model` (a Transformer) keeps the residual streams after `layers` of every position a full pass of
    batch 1 computes, up to `max_len` positions; returns the record (also `model.layer_features`)."""
    count = model.config.num_layers
    if not layers or any(not 0 <= layer < count for layer in layers):
        raise ValueError(f"layer ids {list(layers)} must be within the model's {count} layers (0 .. {count - 1})")
    kept = model.layer_features
    if kept is None or kept.layers != tuple(layers) or kept.rows.shape[0] < max_len:
        rows = torch.zeros(max_len, len(layers) * model.config.hidden_size, dtype=model.dtype, device=model.device)
        kept = LayerFeatures(tuple(layers), rows, torch.tensor(layers, dtype=torch.int64))
        model.layer_features = kept
    return kept


def layer_features(model, tokens: list[int] | torch.Tensor, layers: tuple[int, ...],
                   hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The streams after `layers` of every position of `tokens` (a sequence of ids), from an empty cache in one full
    pass on the model's current path -> (T, n * D) in the model's dtype: the features an EAGLE-3 drafter reads at
    run time, and what a trainer computes its training features with. The model keeps what it kept before.
    With `hidden`, also the pass's final normed hidden states (T, D), which model.logits() turns into logits."""
    ids = torch.as_tensor(tokens, dtype=torch.long, device=model.device).reshape(1, -1)  # (1, T)
    before = model.layer_features
    try:
        model.layer_features = None
        kept = keep_layer_features(model, tuple(layers), ids.shape[1])
        with torch.inference_mode():
            normed = model(ids, 0, model.new_cache(ids.shape[1]))  # (1, T, D)
        return (kept.rows.clone(), normed[0]) if hidden else kept.rows.clone()  # (T, n * D), (T, D)
    finally:
        model.layer_features = before
