"""Packing weight matrices for the CPU kernel's int8 format (csrc/matmul_int8.c says how the kernel reads it), and
unpacking them again for references and tests. int4 is a block format (edge/kernels/block_formats.py).

    packed = pack_int8(weight)        # (N, K) float -> uint8 bytes: per output channel int8, w8a8 in the kernel
    codes, scales = unpack_int8(packed, N, K)
    weight = dequantize(packed, "int8", N, K)   # (N, K) float32: what the codes stand for

Any shape packs: outputs are padded to a multiple of 16 and inputs to a multiple of 4 with zero weights, which add
nothing to any dot product; the kernel writes only the N real outputs.
"""

from __future__ import annotations

import torch

from edge.kernels.cpu_kernel import CONSTANTS

OUTPUT_GROUP = CONSTANTS["INT8_GROUP"]  # outputs packed side by side (csrc/interface.h)
INT8_CHUNK = CONSTANTS["INT8_CHUNK"]  # inputs per chunk


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def int8_packed_size(rows: int, columns: int) -> int:
    padded_rows = _round_up(rows, OUTPUT_GROUP)
    return padded_rows * _round_up(columns, INT8_CHUNK) + 8 * padded_rows


def _padded(weight: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    out = torch.zeros(rows, columns, dtype=torch.float32)
    out[:weight.shape[0], :weight.shape[1]] = weight.detach().float().cpu()
    return out


def pack_int8(weight: torch.Tensor) -> torch.Tensor:
    """weight (N, K) -> the int8 kernel's bytes: per output channel symmetric codes (scale max|w| / 127) in chunks
    of 4 inputs for 16 outputs, then N' float32 scales and N' int32 corrections 128 * sum of codes."""
    if weight.dim() != 2:
        raise ValueError(f"int8 packing takes a matrix, got shape {tuple(weight.shape)}")
    rows, columns = _round_up(weight.shape[0], OUTPUT_GROUP), _round_up(weight.shape[1], INT8_CHUNK)
    wide = _padded(weight, rows, columns)  # (N', K')
    scales = wide.abs().amax(dim=1) / 127.0  # (N',)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(wide / safe[:, None]).clamp_(-127, 127).to(torch.int8)  # (N', K')
    packed = (codes.view(rows // OUTPUT_GROUP, OUTPUT_GROUP, columns // INT8_CHUNK, INT8_CHUNK)  # (G, 16, K'/4, 4)
              .permute(0, 2, 1, 3).contiguous().view(-1))  # (N'*K',): group, chunk, output, 4 codes
    corrections = codes.sum(dim=1, dtype=torch.int32) * 128  # (N',) int32
    return torch.cat([packed.view(torch.uint8), scales.contiguous().view(torch.uint8),
                      corrections.contiguous().view(torch.uint8)])


def unpack_int8(packed: torch.Tensor, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 codes (N, K) and float32 scales (N,) of a packed matrix (codes * scales[:, None] is what it stands
    for)."""
    padded_rows, padded_columns = _round_up(rows, OUTPUT_GROUP), _round_up(columns, INT8_CHUNK)
    size = padded_rows * padded_columns
    codes = (packed[:size].view(torch.int8).view(padded_rows // OUTPUT_GROUP, padded_columns // INT8_CHUNK,
                                                 OUTPUT_GROUP, INT8_CHUNK)
             .permute(0, 2, 1, 3).reshape(padded_rows, padded_columns))  # (N', K')
    scales = packed[size:size + 4 * padded_rows].view(torch.float32)  # (N',)
    return codes[:rows, :columns], scales[:rows]


def dequantize(packed: torch.Tensor, fmt: str, rows: int, columns: int) -> torch.Tensor:
    """The float32 weight (N, K) a matrix packed in `fmt` ("int8") stands for."""
    if fmt != "int8":
        raise ValueError(f"packed format {fmt!r}: edge/kernels/cpu_packing.py packs int8 only")
    codes, scales = unpack_int8(packed, rows, columns)  # (N, K), (N,)
    return codes.float() * scales[:, None]
