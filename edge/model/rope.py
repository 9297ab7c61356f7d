"""Rotary position embeddings: inverse frequencies (with Llama 3 / linear / LongRoPE scaling) and the rotation.

The model computes cos/sin for the positions of each forward pass from `inverse_frequencies` (in float32), times
`attention_factor` (LongRoPE's; 1 otherwise). Only the leading `rotary_dim` dims of a head rotate (all of them unless
the config says otherwise: Phi-4-mini's partial rotary). Gemma 3's local layers rotate with their own base and no
scaling (`local=True`).
"""

from __future__ import annotations

import math

import torch

from edge.model.config import ModelConfig


def inverse_frequencies(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """(R/2,) float32, R the rotary dims: the global layers' (scaled as config.rope_scaling says), or with `local` the
    local layers' (local_rope_theta, unscaled)."""
    dim = config.rotary_dim or config.head_dim
    base = config.local_rope_theta if local else config.rope_theta
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # (R/2,)
    scaling = {} if local else (config.rope_scaling or {})
    rope_type = scaling.get("rope_type", "default")
    # LongRoPE's short factors: the frequencies of contexts up to the original length. Past it transformers encodes the
    # whole sequence again with the long factors, llama.cpp uses them throughout when its context is longer; edge
    # keeps the short ones.
    if rope_type == "longrope":
        factors = torch.tensor(scaling["short_factor"], dtype=torch.float32)
        return 1.0 / (factors * base ** exponents)
    inv_freq = 1.0 / (base ** exponents)  # (R/2,)
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    return inv_freq


def attention_factor(config: ModelConfig) -> float:
    """What cos and sin are multiplied by: LongRoPE's sqrt(1 + ln(s) / ln(original)), s the extension of the context
    (transformers' _compute_longrope_parameters), or its given attention_factor; 1 for every other rope."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("max_position_embeddings", original) / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between interpolated."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    original_context = scaling["original_max_position_embeddings"]
    low_freq_wavelen = original_context / low_freq_factor
    high_freq_wavelen = original_context / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D); cos/sin (T, R) already cast to x's dtype: the leading R dims rotate, the rest pass."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (B, H, T, D)
    return x * cos + rotated * sin
