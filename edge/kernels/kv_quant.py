"""KV-cache quantization, quantized once on append: the plain-torch reference (the specification kernels must match).

Every cached vector (one token, one KV head: Dh values) is quantized on its own, so a token's stored codes do not
depend on what else was written in the same call; a verify pass stores exactly what single decode steps store.

    int8          symmetric, one float16 scale per vector: x ~ code * scale, code in [-127, 127]
    int4          the same with codes in [-7, 7], two per byte
    hierarchical  QuantSpec's int4+int4: an asymmetric 8-bit code c = round((x - low) / step) in [0, 255], with
                  low = min(x) and step = (max(x) - min(x)) / 255 per vector, split into an upper and a lower nibble
                  stored in two planes. The target reads both (8 bits: x ~ low + c * step); the draft reads the upper
                  plane alone (4 bits: x ~ low + (16 * upper + 7.5) * step, the centre of the 16 codes it covers),
                  half the bytes, from the same memory: there is no second cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KV_FORMATS = ("int8", "int4", "hierarchical")


@dataclass
class PackedVectors:
    """Quantized vectors (..., Dh) in one of KV_FORMATS; `planes` as the format describes."""

    kind: str
    planes: tuple[torch.Tensor, ...]  # int8: (codes,); int4: (packed,); hierarchical: (upper, lower) packed
    scale: torch.Tensor  # (..., 1) float16
    low: torch.Tensor | None = None  # (..., 1) float16, hierarchical only


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(..., D) values 0..15 -> (..., D/2) uint8, low nibble first."""
    pairs = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """(..., D/2) uint8 -> (..., D) uint8 values 0..15."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def quantize(x: torch.Tensor, kind: str) -> PackedVectors:
    """x (..., Dh) float -> PackedVectors, each vector along the last axis quantized on its own."""
    x = x.float()
    if kind in ("int8", "int4"):
        top = 127 if kind == "int8" else 7
        scale = (x.abs().amax(-1, keepdim=True) / top).clamp(min=1e-8).half()  # (..., 1)
        codes = torch.round(x / scale.float()).clamp(-top, top)  # (..., Dh)
        if kind == "int8":
            return PackedVectors(kind, (codes.to(torch.int8),), scale)
        return PackedVectors(kind, (pack_nibbles(codes + 8),), scale)
    if kind == "hierarchical":
        low = x.amin(-1, keepdim=True).half()  # (..., 1)
        step = ((x.amax(-1, keepdim=True) - low.float()) / 255).clamp(min=1e-8).half()  # (..., 1)
        codes = torch.round((x - low.float()) / step.float()).clamp(0, 255).to(torch.uint8)  # (..., Dh)
        return PackedVectors(kind, (pack_nibbles(codes >> 4), pack_nibbles(codes & 0x0F)), step, low)
    raise ValueError(f"unknown KV format {kind!r}; expected one of {', '.join(KV_FORMATS)}")


def dequantize(packed: PackedVectors, *, draft: bool = False) -> torch.Tensor:
    """PackedVectors -> float32 (..., Dh); `draft` reads only the upper plane of a hierarchical cache."""
    if packed.kind == "int8":
        return packed.planes[0].float() * packed.scale.float()
    if packed.kind == "int4":
        return (unpack_nibbles(packed.planes[0]).float() - 8) * packed.scale.float()
    upper = unpack_nibbles(packed.planes[0]).float()
    codes = upper * 16 + 7.5 if draft else upper * 16 + unpack_nibbles(packed.planes[1]).float()
    return packed.low.float() + codes * packed.scale.float()
