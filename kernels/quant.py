"""Group-wise weight quantization (int8 / int4): the plain-torch reference that the fast kernels must match.

    q = quantize_weight(w, bits=4, group_size=32)     # w (N, K) float -> QuantizedWeight
    w_hat = q.dequantize()                            # (N, K) float32
    y = QuantizedLinear(q, bias)(x)                   # x (..., K) -> (..., N), x @ w_hat.T (+ bias)

Symmetric, one float16 scale per `group_size` consecutive weights of a row (along K): code = round(w / scale)
clamped to [-2^(b-1), 2^(b-1) - 1], scale = max|w| / (2^(b-1) - 1). int4 codes are stored two per byte (low
nibble first) as unsigned values code + 8; int8 codes as int8. A group size that does not divide K is refused at
quantization time with the sizes that do (edge's CPU packing, kernels/cpu_packing.py, pads instead).

Saved format (`save_quantized` / `load_quantized`): safetensors, each quantized matrix as NAME.qweight (uint8 or
int8) and NAME.scales (float16), other tensors as they are, and the metadata key "edge_quantization" holding
{"format": 1, "bits": b, "group_size": g, "scheme": "symmetric", "quantized": [NAME, ...]}: self-describing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

FORMAT_VERSION = 1
METADATA_KEY = "edge_quantization"


@dataclass
class QuantizedWeight:
    codes: torch.Tensor  # int8: (N, K) int8; int4: (N, K // 2) uint8, two codes per byte (low nibble first)
    scales: torch.Tensor  # (N, K // group_size) float16
    bits: int
    group_size: int
    shape: tuple[int, int]  # (N, K)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def signed_codes(self) -> torch.Tensor:
        """(N, K) int8 codes in [-2^(b-1), 2^(b-1) - 1]."""
        if self.bits == 8:
            return self.codes
        low = (self.codes & 0x0F).to(torch.int8) - 8  # (N, K/2)
        high = (self.codes >> 4).to(torch.int8) - 8  # (N, K/2)
        return torch.stack((low, high), dim=-1).reshape(self.shape)  # (N, K)

    def dequantize(self) -> torch.Tensor:
        rows, columns = self.shape
        codes = self.signed_codes().float().reshape(rows, columns // self.group_size, self.group_size)
        return (codes * self.scales.float()[..., None]).reshape(rows, columns)  # (N, K)


def quantize_weight(weight: torch.Tensor, bits: int = 4, group_size: int = 32) -> QuantizedWeight:
    """weight (N, K) -> group-wise symmetric codes and float16 scales (see the module docstring)."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    rows, columns = weight.shape
    if group_size < 1 or columns % group_size:
        fitting = [str(size) for size in (128, 64, 32, 16, 8, 4, 2) if columns % size == 0]
        raise ValueError(f"group size {group_size} does not divide the input dimension {columns}; "
                         + (f"pick one that does: {', '.join(fitting)}" if fitting else
                            f"{columns} has no even divisor up to 128"))
    if bits == 4 and group_size % 2:
        raise ValueError(f"int4 packs two codes per byte, so the group size must be even, got {group_size}")
    top = 2 ** (bits - 1) - 1
    groups = weight.detach().float().reshape(rows, columns // group_size, group_size)  # (N, G, g)
    scales = (groups.abs().amax(-1) / top).half()  # (N, G), rounded to what is stored
    divisors = torch.where(scales > 0, scales.float(), torch.ones((), device=scales.device))  # all-zero groups: codes 0
    codes = torch.round(groups / divisors[..., None]).clamp(-top - 1, top).to(torch.int8).reshape(rows, columns)
    if bits == 4:
        unsigned = (codes + 8).to(torch.uint8).reshape(rows, columns // 2, 2)  # (N, K/2, 2)
        codes = unsigned[..., 0] | (unsigned[..., 1] << 4)  # (N, K/2)
    return QuantizedWeight(codes.contiguous(), scales.contiguous(), bits, group_size, (rows, columns))


class QuantizedLinear(nn.Module):
    """A Linear whose weight is a QuantizedWeight; the reference forward dequantizes it (kernels/ dispatch faster
    paths by the same contract)."""

    rowwise, max_rows = None, 0  # edge's model asks its projections for a batch-invariant kernel: none here

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
        from kernels.dispatch import quantized_linear

        padded = self.quantized.shape[1]
        if x.shape[-1] != padded:
            x = F.pad(x, (0, padded - x.shape[-1]))  # (..., K) -> (..., K + padding) zeros
        return quantized_linear(x, self.quantized, self.bias)  # Triton on a capable GPU, else the reference


def save_quantized(tensors: dict[str, torch.Tensor | QuantizedWeight], path: str | Path, *, bits: int,
                   group_size: int) -> None:
    """Write plain and quantized tensors to one self-describing safetensors file."""
    from safetensors.torch import save_file

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
    from safetensors import safe_open

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
