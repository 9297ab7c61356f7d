"""LayerSkip training forward for a transformers Llama model: layer dropout rising with depth, early-exit losses.

    h = embed(x)
    for layer l in 0..L-1:
        out = layer(h)                            (transformers' decoder layer, residuals inside)
        h = out, or h unchanged for the samples that drop layer l (probability p_max * l / (L-1))
        if l is an active exit: loss_l = CE(lm_head(norm(h)), y)     shared norm and head
    loss = (CE_final + sum_l scale_l * loss_l) / (1 + sum_l scale_l)

Exits rotate (LayerSkip's "rotational curriculum"): at step s the exits are the layers l with (l + s) % R == 0,
so every layer is trained as an exit every R steps at a fraction of the cost of all exits every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LayerSkipConfig:
    max_dropout: float = 0.1  # layer dropout of the last layer; layer 0 never drops
    exit_scale: float = 0.3  # weight of the deepest early exit; shallower exits get proportionally less
    rotation: int = 6  # every layer is an active exit once every `rotation` steps

    def dropout(self, layer: int, num_layers: int) -> float:
        return self.max_dropout * layer / max(num_layers - 1, 1)

    def exit_weight(self, layer: int, num_layers: int) -> float:
        return self.exit_scale * (layer + 1) / num_layers

    def active_exits(self, step: int, num_layers: int) -> list[int]:
        return [layer for layer in range(num_layers - 1) if (layer + step) % self.rotation == 0]


def exit_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The shared head on an intermediate hidden state: final norm, then lm_head."""
    return model.lm_head(model.model.norm(hidden))  # (B, T, V)


def layer_outputs(model, tokens: torch.Tensor, keep: list[torch.Tensor] | None = None):
    """Yield (layer index, hidden after that layer) for a transformers Llama model, causal, no cache.

    keep[l] is an optional (B, 1, 1) 0/1 mask: samples with 0 skip layer l (layer dropout)."""
    inner = model.model
    hidden = inner.embed_tokens(tokens)  # (B, T, D)
    positions = torch.arange(tokens.shape[1], device=tokens.device)[None, :]  # (1, T)
    rope = inner.rotary_emb(hidden, positions)
    for index, layer in enumerate(inner.layers):
        out = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rope)
        out = out[0] if isinstance(out, tuple) else out
        hidden = out if keep is None else torch.where(keep[index].bool(), out, hidden)
        yield index, hidden


def layerskip_loss(model, tokens: torch.Tensor, targets: torch.Tensor, step: int, recipe: LayerSkipConfig,
                   generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss for one batch, and the plain final-layer cross-entropy for logging."""
    num_layers = len(model.model.layers)
    batch = tokens.shape[0]
    keep = [
        (torch.rand(batch, 1, 1, generator=generator) >= recipe.dropout(layer, num_layers)).to(tokens.device)
        for layer in range(num_layers)
    ]
    exits = set(recipe.active_exits(step, num_layers))
    total, weights, parts = None, 0.0, {}
    for layer, hidden in layer_outputs(model, tokens, keep):
        if layer == num_layers - 1:
            loss = F.cross_entropy(exit_logits(model, hidden).flatten(0, 1), targets.flatten())
            parts["final_ce"] = loss.item()
            total = loss if total is None else total + loss
            weights += 1.0
        elif layer in exits:
            weight = recipe.exit_weight(layer, num_layers)
            loss = F.cross_entropy(exit_logits(model, hidden).flatten(0, 1), targets.flatten())
            parts[f"exit_{layer}_ce"] = loss.item()
            total = weight * loss if total is None else total + weight * loss
            weights += weight
    return total / weights, parts


@torch.no_grad()
def heldout_losses(model, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """Mean cross-entropy on held-out batches at every layer's exit (the last entry is the full model)."""
    num_layers = len(model.model.layers)
    sums, count = [0.0] * num_layers, 0
    for tokens, targets in batches:
        for layer, hidden in layer_outputs(model, tokens):
            logits = exit_logits(model, hidden)
            sums[layer] += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
        count += targets.numel()
    return [total / count for total in sums]
