"""Which layers a layer-skip draft of this model should skip, measured on the model itself.

    influence = layer_influence(model, ids)           # one value per layer: how much it turns the residual stream
    skip_sets(influence, (1 / 8, 1 / 4, 1 / 3))      # the least influential layers, first and last always kept

A fixed rule (skip every other layer of the upper half) suits some models and ruins others: how redundant each layer
is differs by model (SWIFT and CLaSp search the skip set per model; ShortGPT ranks layers by Block Influence). Here
one full pass over a short calibration text measures each layer's influence, 1 - cos(input, output) of its residual
update averaged over the positions, and a draft skips the layers that change the stream least. The pass takes a
fraction of a second on a 135M model; the adaptive drafter then picks among the calibrated sets by measured speed.
"""

from __future__ import annotations

import torch

from edge.model.calibration import calibration_pass
from edge.model.transformer import Transformer


def layer_influence(model: Transformer, token_ids: list[int]) -> list[float]:
    """1 - the mean cosine similarity between each layer's input and output hidden states over `token_ids`."""
    captured: dict[int, float] = {}

    def measure(layer: int):
        def hook(_module, inputs, output) -> None:
            before, after = inputs[0].float(), output.float()  # (B, T, D)
            captured[layer] = 1.0 - torch.nn.functional.cosine_similarity(before, after, dim=-1).mean().item()
        return hook

    handles = [block.register_forward_hook(measure(i)) for i, block in enumerate(model.layers)]
    try:
        calibration_pass(model, token_ids)
    finally:
        for handle in handles:
            handle.remove()
    return [captured[i] for i in range(model.config.num_layers)]


def skip_sets(influence: list[float], fractions: tuple[float, ...]) -> list[list[int]]:
    """For each fraction of the depth, the least influential layers to skip (the first and last layer are kept:
    they move the stream most in every model measured); duplicates and empty sets dropped."""
    layers = len(influence)
    inner = sorted(range(1, layers - 1), key=lambda layer: influence[layer])
    sets: list[list[int]] = []
    for fraction in fractions:
        chosen = sorted(inner[:round(layers * fraction)])
        if chosen and chosen not in sets:
            sets.append(chosen)
    return sets
