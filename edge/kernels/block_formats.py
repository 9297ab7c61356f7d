"""llama.cpp's block quantizations (GGUF tensor types) as edge's kernel formats: a tensor's bytes rearranged once into
groups of 16 outputs (csrc/blocks.h says how), never re-quantized, and run by csrc/matmul_blocks.c.

    matrix = BlockMatrix.from_file("q4_k", data, rows, columns)     # data: the file's bytes (rows, row bytes)
    fused = BlockMatrix.stack([q, k, v])         # q/k/v or gate/up as one matrix (segments may differ in type)
    y = kernel.blocks(x, fused, bias)            # x (..., K) float32 -> (..., N) float32 (cpu_kernel.CpuKernel)
    weight = matrix.dequantized()                # (N, K) float32: the values the file's bytes stand for

The types: the 32-weight blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the 256-weight k-quants Q4_K, Q5_K, Q6_K (what
Q4_K_M, Q5_K_M and Q6_K files hold); F32, F16 and BF16 segments too (a matrix a quantized file keeps in floats), on
the float kernel. Activations are quantized to 8 bits per block of 32 for the first and per 256 for
the k-quants, as llama.cpp does; integer dots are exact and the float steps fixed, so every CPU path gives the same
bits and a row never depends on the rest of the call.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import torch

from edge.kernels.cpu_kernel import CONSTANTS, CpuKernel, ffi

MAX_SEGMENTS = CONSTANTS["BLOCKS_MAX_SEGMENTS"]
GROUP = CONSTANTS["BLOCKS_GROUP"]  # outputs side by side
FLOAT_TYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}  # kept in the file's rows


@dataclass(frozen=True)
class BlockFormat:
    name: str  # GGUF's type name, lower case ("q4_k")
    number: int  # ggml's type number (GGUF's tensor_type): the C side's BlockType
    weights: int  # per block
    file_bytes: int  # one output's block in the file
    group_bytes: int  # a group of 16 outputs' block in memory (csrc/interface.h group_*)
    activations: str  # how a row is quantized against it


def _block_format(name: str, number: int) -> BlockFormat:
    """A BlockType of the C header (BLOCKS_Q4_K -> "q4_k") with its sizes: the header's structs of one output's
    block in the file (block_q4_k) and of a group's block here (group_q4_k)."""
    if name in FLOAT_TYPES:  # a matrix a quantized file keeps in floats: the file's rows as they are, float kernel
        return BlockFormat(name, number, 1, FLOAT_TYPES[name].itemsize, 0, "float32")
    weights = CONSTANTS["QK_K"] if name.endswith("_k") else CONSTANTS["QK"]
    return BlockFormat(name, number, weights, ffi.sizeof(f"block_{name}"), ffi.sizeof(f"group_{name}"),
                       f"8-bit per {weights}")


FORMATS = {f.name: f for f in (_block_format(name.removeprefix("BLOCKS_").lower(), number)
                               for number, name in sorted(ffi.typeof("BlockType").elements.items()))}
QUANTIZED = tuple(name for name, fmt in FORMATS.items() if fmt.group_bytes)
QUANTIZERS = ("q4_1", "q8_0")  # what edge itself quantizes float weights into (csrc/blocks_quantize.c)


def packed_bytes(name: str, rows: int, columns: int) -> int:
    """Bytes a (rows, columns) matrix of this format takes in memory (rows in whole blocks: padded with zero
    weights where `columns` is not a multiple)."""
    fmt = FORMATS[name]
    if not fmt.group_bytes:  # a float format: the file's rows
        return rows * columns * fmt.file_bytes
    return -(-rows // GROUP) * -(-columns // fmt.weights) * fmt.group_bytes


def file_bytes(name: str, rows: int, columns: int) -> int:
    """Bytes the same matrix takes in a GGUF file's layout (rows in whole blocks)."""
    fmt = FORMATS[name]
    return rows * -(-columns // fmt.weights) * fmt.file_bytes


class PackedArena:
    """One memory region for a model's packed matrices, on 2 MiB pages where the OS gives them (Linux's
    transparent huge pages, asked for with madvise): a decode step streams every matrix once, and on 4 KiB pages
    the TLB misses and the prefetchers' stops at each page cost a sixth of a step (an AVX-512 Xeon, 1.1B Q4_K_M).
    take() hands out 64-byte-aligned tensors; they keep the region alive."""

    ALIGN = 64

    def __init__(self, size: int) -> None:
        self.size, self.used = max(size, 1), 0
        self.buffer = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            try:
                self.buffer.madvise(advice)
            except OSError:  # no transparent huge pages here: 4 KiB pages, the same bytes
                pass
        self.bytes = torch.frombuffer(self.buffer, dtype=torch.uint8)

    def take(self, size: int) -> torch.Tensor:
        start = -(-self.used // self.ALIGN) * self.ALIGN
        if start + size > self.size:
            raise ValueError(f"the arena of {self.size} bytes has {self.size - start} left, not {size}")
        self.used = start + size
        return self.bytes[start:start + size]



def _kernel() -> CpuKernel:
    """This CPU's kernel library (any path's would do: repacking moves bits the same way on all)."""
    kernel = CpuKernel.load()
    if kernel is None:
        raise OSError("llama.cpp's block formats run on edge's CPU kernel, which cannot be built here "
                      "(it needs a C compiler with OpenMP)")
    return kernel


def quantize_file(name: str, weight: torch.Tensor, threads: int = 0, kernel: CpuKernel | None = None) -> np.ndarray:
    """A float matrix (N, K) quantized by edge into `name` ("q4_1" or "q8_0"), as a GGUF file stores that type: N rows
    of ceil(K / 32) blocks (csrc/blocks_quantize.c). `kernel`: one path's kernel (default: this CPU's)."""
    if name not in QUANTIZERS:
        raise ValueError(f"edge quantizes into {', '.join(QUANTIZERS)}, not {name}")
    rows, columns = weight.shape
    source = weight.detach().to(torch.float32).contiguous()
    data = np.empty(file_bytes(name, rows, columns), dtype=np.uint8)
    (kernel or _kernel()).quantize_blocks(FORMATS[name].number, source, torch.from_numpy(data),
                                          threads or torch.get_num_threads())
    return data

class BlockMatrix:
    """A matrix in block formats, as the kernel reads it: segments of rows, each (format name, rows, packed bytes)."""

    def __init__(self, segments: list[tuple[str, int, torch.Tensor]], columns: int) -> None:
        if not 1 <= len(segments) <= MAX_SEGMENTS:
            raise ValueError(f"a block matrix has 1 to {MAX_SEGMENTS} segments, got {len(segments)}")
        self.segments, self.columns = segments, columns
        self.rows = sum(rows for _, rows, _ in segments)
        # the C struct lives in a tensor, so that a weights table takes its address as it takes a packed matrix's
        self.table_entry = torch.zeros(ffi.sizeof("BlockMatrix"), dtype=torch.uint8)
        view = ffi.cast("BlockMatrix *", self.table_entry.data_ptr())
        view.count = len(segments)
        for i, (name, rows, packed) in enumerate(segments):
            view.formats[i], view.rows[i] = FORMATS[name].number, rows
            view.data[i] = ffi.cast("void *", packed.data_ptr())
        # the tensors above must stay alive as long as the struct is used

    @classmethod
    def from_file(cls, name: str, data, rows: int, columns: int, threads: int = 0,
                  arena: PackedArena | None = None) -> "BlockMatrix":
        """From a tensor's bytes as a GGUF file stores them: rows of `columns` / B blocks (numpy or torch uint8; a
        last partial block padded with zero weights); packed into `arena` when given, else into a tensor of its
        own."""
        fmt = FORMATS[name]
        source = torch.as_tensor(np.ascontiguousarray(data)).view(torch.uint8).reshape(-1)
        if source.numel() != file_bytes(name, rows, columns):
            raise ValueError(f"{name} ({rows}, {columns}) takes {file_bytes(name, rows, columns)} bytes, "
                             f"got {source.numel()}")
        size = packed_bytes(name, rows, columns)
        packed = arena.take(size) if arena is not None else torch.empty(size, dtype=torch.uint8)
        _kernel().repack(fmt.number, source, rows, columns, packed, threads or torch.get_num_threads())
        return cls([(name, rows, packed)], columns)

    @classmethod
    def quantized(cls, name: str, weight: torch.Tensor, threads: int = 0,
                  arena: PackedArena | None = None) -> "BlockMatrix":
        """A float matrix (N, K) quantized by edge (csrc/blocks_quantize.c): "q4_1", 4-bit codes with a searched scale
        and minimum per 32 weights; "q8_0", 8-bit codes with a scale per 32 (any K: the last block padded with zero
        weights)."""
        rows, columns = weight.shape
        return cls.from_file(name, quantize_file(name, weight, threads), rows, columns, threads, arena)

    @classmethod
    def stack(cls, parts: list["BlockMatrix"]) -> "BlockMatrix":
        """Matrices with the same columns as one (their rows one after another): a fused q/k/v or gate/up."""
        columns = {part.columns for part in parts}
        if len(columns) != 1:
            raise ValueError(f"stacked block matrices must have the same columns, got {sorted(columns)}")
        return cls([segment for part in parts for segment in part.segments], columns.pop())

    @property
    def formats(self) -> list[str]:
        return [name for name, _, _ in self.segments]

    @property
    def nbytes(self) -> int:
        return sum(packed.numel() for _, _, packed in self.segments)

    @property
    def address(self) -> int:
        """Where the C side's BlockMatrix is (what the fused calls' weight tables point at)."""
        return self.table_entry.data_ptr()

    def dequantized(self, first: int = 0, count: int | None = None) -> torch.Tensor:
        """Rows [first, first + count) (default: all) as float32 (count, K): the values the file's bytes stand for."""
        count = self.rows - first if count is None else count
        out = torch.empty(count, self.columns, dtype=torch.float32)
        kernel, done, start = _kernel(), 0, 0
        for name, rows, packed in self.segments:
            begin, end = max(first, start), min(first + count, start + rows)
            if begin < end:
                kernel.dequantize_rows(FORMATS[name].number, packed, self.columns, begin - start, end - begin,
                                       out[done:])
                done += end - begin
            start += rows
        return out

    def __repr__(self) -> str:
        return f"BlockMatrix({'+'.join(self.formats)}, {self.rows}x{self.columns})"
