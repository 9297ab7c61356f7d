"""Group-wise weight quantization (int8 / int4) as a layer, and saved: the plain-torch reference that the fast
kernels must match.

    q = quantize_weight(w, bits=4, group_size=32)     # w (N, K) float -> QuantizedWeight (edge/kernels/quant_weight.py)
    y = QuantizedLinear(q, bias)(x)                   # x (..., K) -> (..., N), x @ w_hat.T (+ bias)

Saved format (`save_quantized` / `load_quantized`): safetensors, each quantized matrix as NAME.qweight (uint8 or
int8) and NAME.scales (float16), other tensors as they are, and the metadata key "edge_quantization" holding
{"format": 1, "bits": b, "group_size": g, "scheme": "symmetric", "quantized": [NAME, ...]}: self-describing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

from edge.kernels.dispatch import quantized_linear
from edge.kernels.quant_weight import QuantizedWeight, quantize_weight

__all__ = ["QuantizedWeight", "quantize_weight", "QuantizedLinear", "save_quantized", "load_quantized"]

FORMAT_VERSION = 1
METADATA_KEY = "edge_quantization"


class QuantizedLinear(nn.Module):
    """A Linear whose weight is a QuantizedWeight; the reference forward dequantizes it (kernels/ dispatch faster
    paths by the same contract)."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None, in_features: int | None = None
                 ) -> None:
        super().__init__()
        self.quantized = weight
        self.register_buffer("codes", weight.codes)
        self.register_buffer("scales", weight.scales)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self.out_features, padded = weight.shape
        self.in_features = in_features or padded  # the weight may carry zero columns up to a whole group

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, group_size: int = 32) -> "QuantizedLinear":
        """Any input width: a width the group size does not divide is padded with zero columns (they add nothing)."""
        weight = linear.weight.detach()
        padding = -weight.shape[1] % group_size
        if padding:
            weight = F.pad(weight, (0, padding))  # (N, K) -> (N, K + padding)
        return cls(quantize_weight(weight, bits, group_size), linear.bias, linear.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padded = self.quantized.shape[1]
        if x.shape[-1] != padded:
            x = F.pad(x, (0, padded - x.shape[-1]))  # (..., K) -> (..., K + padding) zeros
        return quantized_linear(x, self.quantized, self.bias)  # Triton on a capable GPU, else the reference


def save_quantized(tensors: dict[str, torch.Tensor | QuantizedWeight], path: str | Path, *, bits: int,
                   group_size: int) -> None:
    """Write plain and quantized tensors to one self-describing safetensors file."""
    flat, quantized = {}, []
    for name, tensor in tensors.items():
        if isinstance(tensor, QuantizedWeight):
            flat[f"{name}.qweight"], flat[f"{name}.scales"] = tensor.codes, tensor.scales
            quantized.append({"name": name, "shape": list(tensor.shape)})
        else:
            flat[name] = tensor.contiguous()
    metadata = {"format": FORMAT_VERSION, "bits": bits, "group_size": group_size, "scheme": "symmetric",
                "quantized": quantized}
    save_file(flat, str(path), metadata={METADATA_KEY: json.dumps(metadata)})


def load_quantized(path: str | Path) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Read a file written by save_quantized (safetensors only: no code runs); refuse unknown formats."""
    with safe_open(str(path), framework="pt") as handle:
        raw = (handle.metadata() or {}).get(METADATA_KEY)
        if raw is None:
            raise ValueError(f"{path} has no {METADATA_KEY} metadata; it was not written by edge's quantizer")
        metadata = json.loads(raw)
        if metadata.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path} is quantization format {metadata.get('format')}; this edge reads "
                             f"{FORMAT_VERSION}")
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    result: dict[str, torch.Tensor | QuantizedWeight] = {}
    for entry in metadata["quantized"]:
        name = entry["name"]
        result[name] = QuantizedWeight(tensors.pop(f"{name}.qweight"), tensors.pop(f"{name}.scales"),
                                       metadata["bits"], metadata["group_size"], tuple(entry["shape"]))
    result.update(tensors)
    return result
