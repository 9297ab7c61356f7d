"""The group-wise quantized weight (int8 / int4) and its plain-torch quantizer: the reference the fast kernels match.

    q = quantize_weight(w, bits=4, group_size=32)     # w (N, K) float -> QuantizedWeight
    w_hat = q.dequantize()                            # (N, K) float32

Symmetric, one float16 scale per `group_size` consecutive weights of a row (along K): code = round(w / scale)
clamped to [-2^(b-1), 2^(b-1) - 1], scale = max|w| / (2^(b-1) - 1). int4 codes are stored two per byte (low
nibble first) as unsigned values code + 8; int8 codes as int8. A group size that does not divide K is refused at
quantization time with the sizes that do (edge's CPU packing, edge/kernels/cpu_packing.py, pads instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
