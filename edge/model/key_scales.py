"""Per-channel key scales for a quantized KV cache, so that a model's outlier key channels survive quantization.

    scales = outlier_key_scales(model, tokenizer.encode(CALIBRATION_TEXT))   # (L, Hkv, Dh) powers of two, or None
    cache.key_scales = scales        # keys divided by them before they are quantized, multiplied back when read

A quantized cache stores each key vector with one step for all its channels (per token). Some families' keys have a
few channels far larger than the rest (Qwen's, from their key biases: KIVI and KVQuant quantize keys per channel for
this reason), and then that step leaves the other channels with one or two levels of the 16 a 4-bit draft reads. One
pass over a short calibration text measures each rotary pair's largest magnitude (the cache holds keys after RoPE,
which turns a pair's two channels into each other); a pair at least OUTLIER_RATIO times the median of its head is
divided by the smallest power of two that brings it within the head's largest ordinary pair. Powers of two divide and multiply exactly, so only the rounding of
the quantization itself changes. Where no pair stands out (SmolLM2's largest are 3-5x their median, and scaling them
measured no better), the cache keeps no scales and runs exactly as before.
"""

from __future__ import annotations

import torch

from edge.model.calibration import calibration_pass
from edge.model.transformer import Transformer

OUTLIER_RATIO = 8.0  # a rotary pair this many times its head's median magnitude is scaled down


def pair_magnitudes(model: Transformer, token_ids: list[int]) -> torch.Tensor:
    """(L, Hkv, Dh / 2): each rotary pair's largest magnitude over the keys the cache would hold for `token_ids`."""
    keys = calibration_pass(model, token_ids).keys[:, 0].float()  # (L, Hkv, T, Dh), after RoPE (and a key norm, where the model has one)
    half = keys.shape[-1] // 2
    return torch.sqrt(keys[..., :half] ** 2 + keys[..., half:] ** 2).amax(dim=2)  # (L, Hkv, Dh / 2)


def outlier_key_scales(model: Transformer, token_ids: list[int], ratio: float = OUTLIER_RATIO) -> torch.Tensor | None:
    """(L, Hkv, Dh) float32 powers of two (1 for ordinary channels), or None where no rotary pair reaches `ratio`
    times its head's median magnitude."""
    magnitude = pair_magnitudes(model, token_ids)  # (L, Hkv, Dh / 2)
    median = magnitude.median(dim=-1, keepdim=True).values.clamp_min(1e-6)  # (L, Hkv, 1)
    outlier = magnitude >= ratio * median
    if not bool(outlier.any()):
        return None
    # each outlier pair down to the head's largest ordinary pair (no further: a scale also multiplies that channel's
    # rounding error back up), by the smallest power of two that gets it there
    ordinary = torch.where(outlier, torch.zeros_like(magnitude), magnitude).amax(dim=-1, keepdim=True)  # (L, Hkv, 1)
    needed = torch.exp2(torch.ceil(torch.log2(magnitude / ordinary.clamp_min(1e-6))))
    scales = torch.where(outlier, needed, torch.ones_like(magnitude))  # (L, Hkv, Dh / 2)
    return torch.cat([scales, scales], dim=-1).contiguous()  # (L, Hkv, Dh): both channels of a pair alike
