"""A GGUF file's weights loaded into `Transformer`, in the file's own quantization: the folder
edge/sources/gguf_checkpoint.py wrote says where each tensor is, and the file is memory-mapped and read one tensor at a
time.

    model = block_model(folder, index, kernel)    # edge.sources.loading.load_model calls these for such folders
    tensors = float_tensors(folder, index)        # ... or builds a float model from these

- Quantized files on the CPU (float32 compute, edge's kernel available): each matrix keeps its GGUF type (Q4_K, Q6_K,
  Q8_0, ...), its bytes rearranged once into the kernel's groups (edge/kernels/block_formats.py); q/k/v and gate/up are
  fused as segments that keep their own types; the embedding and head likewise. Nothing is dequantized to 16 bits.
- Float files (F32, F16, BF16 matrices), another device or dtype, or `dequantize=True` (--weights float16): the
  values as float tensors, quantized ones dequantized by the gguf package (its reference of llama.cpp's formats).

Each tensor's pages of the file are released from resident memory once its copy is made, so loading holds about one
copy of the weights.
"""

from __future__ import annotations

import mmap
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.model.block_weights import BlockEmbedding, BlockLinear
from edge.model.config import ModelConfig
from edge.errors import CheckpointError, UnsupportedModelError
from edge.model.kernel_glue import use_kernel
from edge.model.transformer import Transformer
from edge.sources.checkpoint_names import layer_names
from edge.model.rope import inverse_frequencies
from edge.kernels.block_formats import FORMATS as BLOCK_FORMATS
from edge.kernels.block_formats import QUANTIZED
from edge.kernels.block_formats import BlockMatrix, PackedArena, packed_bytes

FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.int16}


def block_format(kind: str) -> str | None:
    """The kernel format name of a GGUF tensor type ("Q4_K" -> "q4_k"), None where the kernel does not run it."""
    name = kind.lower()
    return name if name in QUANTIZED else None


def runs_as_blocks(index: dict) -> bool:
    """Whether the file's layer matrices are quantized (then they run in their blocks), not all float."""
    return any(len(entry["shape"]) == 2 and entry["type"] not in FLOAT_DTYPES for entry in index["tensors"]
               if entry["name"].startswith("model.layers."))


def unsupported_types(index: dict) -> list[str]:
    """The quantized types of the file's matrices that edge's kernel does not run (IQ2_XXS, TQ1_0, ...)."""
    return sorted({entry["type"] for entry in index["tensors"] if len(entry["shape"]) == 2
                   and entry["type"] not in FLOAT_DTYPES and block_format(entry["type"]) is None})


def stored_bytes(index: dict) -> int:
    """The bytes edge holds for the file's weights in their own formats (the grouped layout of the block types)."""
    total = 0
    for entry in index["tensors"]:
        name = block_format(entry["type"])
        total += packed_bytes(name, *entry["shape"]) if name and len(entry["shape"]) == 2 else entry["bytes"]
    return total


class GGUFFile:
    """The file's bytes, memory-mapped copy-on-write (so float tensors can be zero-copy views), by index entry."""

    def __init__(self, path: Path) -> None:
        try:
            with path.open("rb") as handle:
                self.buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
        self.path = path

    def raw(self, entry: dict) -> np.ndarray:
        """The entry's bytes as the file stores them: (rows, row bytes) uint8 for a matrix, (n,) bytes for 1-D; rows
        put back from llama.cpp's rotary order when the entry says so (a copy)."""
        data = np.frombuffer(self.buffer, dtype=np.uint8, count=entry["bytes"], offset=entry["offset"])
        rows = entry["shape"][0]
        data = data.reshape(rows, -1)
        if entry["heads"]:
            data = data[rotary_rows(rows, entry["heads"])]
        return data

    def floats(self, entry: dict) -> torch.Tensor:
        """The entry's values as a torch tensor: float types as stored, quantized ones dequantized to float32."""
        kind, shape = entry["type"], entry["shape"]
        raw = self.raw(entry)
        if kind in FLOAT_DTYPES:
            values = torch.from_numpy(np.ascontiguousarray(raw).view(NUMPY_DTYPES[kind]))
            values = values.view(torch.bfloat16) if kind == "BF16" else values
            return values.reshape(shape)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        try:
            return torch.from_numpy(dequantize(np.ascontiguousarray(raw), GGMLQuantizationType[kind])).reshape(shape)
        except (NotImplementedError, KeyError):
            raise UnsupportedModelError(f"the gguf package cannot dequantize {kind} tensors ({entry['gguf']}); use a "
                                        "file in another type") from None

    def release(self, entry: dict) -> None:
        """Drop the entry's pages from resident memory (its copy has been made; it is not read again)."""
        page = mmap.PAGESIZE
        first, last = -(-entry["offset"] // page) * page, (entry["offset"] + entry["bytes"]) // page * page
        if last > first:
            self.buffer.madvise(mmap.MADV_DONTNEED, first, last - first)


def rotary_rows(rows: int, heads: int) -> np.ndarray:
    """For each Hugging Face row of a q or k projection, the row llama.cpp stored it as (convert_hf_to_gguf.py's
    LlamaModel.permute interleaves each head's two halves: (2, D/2) -> (D/2, 2))."""
    order = np.arange(rows).reshape(heads, rows // heads // 2, 2)  # file rows: (head, D/2, half)
    return order.transpose(0, 2, 1).reshape(rows)  # HF row (head, half, i) <- file row (head, i, half)


def block_model(folder: Path, index: dict, rowwise, config: ModelConfig | None = None) -> Transformer:
    """The model with every matrix in its own GGUF type (quantized files on the CPU; see the module docstring).
    `config` is the folder's, when it has been read already."""
    config = config if config is not None else ModelConfig.from_dir(folder)
    file = GGUFFile(Path(index["file"]))
    unsupported = unsupported_types(index)
    if unsupported:
        raise UnsupportedModelError(
            f"{file.path.name} holds {', '.join(unsupported)} tensors, which edge's kernel does not run (it runs "
            f"{', '.join(f.upper() for f in QUANTIZED)}, F16, BF16 and F32); load it with --weights float16 to "
            f"dequantize every matrix ({_gib(_float16_bytes(config))} in memory against the file's "
            f"{_gib(file.path.stat().st_size)}), or use a file in one of those types")
    return _block_model(config, file, {entry["name"]: entry for entry in index["tensors"]}, rowwise)


def float_tensors(folder: Path, index: dict, config: ModelConfig | None = None) -> "FloatTensors":
    """The file's tensors as float tensors by Hugging Face name (edge.sources.loading builds the float model from them);
    a quantized file says once, on stderr, what dequantizing it costs (`config`: the folder's, when it has been read
    already)."""
    file = GGUFFile(Path(index["file"]))
    if runs_as_blocks(index):
        config = config if config is not None else ModelConfig.from_dir(folder)
        print(f"edge: dequantizing {file.path.name} ({index['file_type']}) to 16 bits: "
              f"{_gib(_float16_bytes(config))} in memory against the file's {_gib(file.path.stat().st_size)}",
              file=sys.stderr, flush=True)
    return FloatTensors(file, {entry["name"]: entry for entry in index["tensors"]})


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _float16_bytes(config: ModelConfig) -> int:
    return config.shape().weight_bytes("float16")


class FloatTensors(Mapping):
    """The file's tensors by Hugging Face name as float tensors, made when read (one at a time): what
    edge.sources.loading.build_state takes in place of a safetensors file's (`tensors`, `release`)."""

    def __init__(self, file: GGUFFile, entries: dict) -> None:
        self.file, self.entries = file, entries
        self.source_dtype = _single_float(entries)
        self.tensors = self

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.file.floats(self.entries[name])

    def __contains__(self, name: object) -> bool:  # without reading the tensor (Mapping's would)
        return name in self.entries

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def release(self, name: str) -> None:
        self.file.release(self.entries[name])


def _single_float(entries: dict) -> torch.dtype | None:
    """The dtype the float model keeps: the matrices' own when they are all one float type, else float16 (what
    dequantized blocks narrow to within float16's rounding)."""
    kinds = {entry["type"] for entry in entries.values() if len(entry["shape"]) == 2}
    return FLOAT_DTYPES[kinds.pop()] if len(kinds) == 1 and next(iter(kinds)) in FLOAT_DTYPES else torch.float16


# ---- the block model ------------------------------------------------------------------------------------------


def _block_model(config: ModelConfig, file: GGUFFile, entries: dict, rowwise) -> Transformer:
    """Every matrix in its own type (float ones as stored), norms and biases in float32; the packed matrices in one
    arena on huge pages (edge/kernels/block_formats.py PackedArena)."""
    model = Transformer(config, device="meta")
    blocks = _BlockReader(file, entries)
    for i, block in enumerate(model.layers):
        _fill_layer(block, f"model.layers.{i}.", blocks, config, model.runner)
    model.norm.weight = blocks.vector("model.norm.weight")
    _fill_embedding_and_head(model, blocks, config, model.runner)
    model.compute_dtype = torch.float32
    model.inv_freq = inverse_frequencies(config)  # the meta-device buffers held no data
    if config.local_rope_layers:
        model.inv_freq_local = inverse_frequencies(config, local=True)
    use_kernel(model, rowwise)
    return model.eval().requires_grad_(False)


class _BlockReader:
    """A file's tensors as the block model holds them, read one at a time (each one's pages released once copied):
    vectors in float32, matrices in their own types, packed into one arena sized for all of them."""

    def __init__(self, file: GGUFFile, entries: dict) -> None:
        self.file, self.entries = file, entries
        self.arena = PackedArena(sum(packed_bytes(entry["type"].lower(), *entry["shape"]) + PackedArena.ALIGN
                                     for entry in entries.values()
                                     if len(entry["shape"]) == 2 and entry["type"].lower() in BLOCK_FORMATS))

    def vector(self, name: str) -> nn.Parameter | None:
        entry = self.entries.get(name)
        if entry is None:
            return None
        values = self.file.floats(entry).float().clone()
        self.file.release(entry)
        return nn.Parameter(values, requires_grad=False)

    def matrix(self, names: list[str]) -> BlockMatrix:
        """The named matrices in their own types, stacked (q/k/v, gate/up) as segments that keep them."""
        parts = []
        for name in names:
            entry = self.entries[name]
            rows, columns = entry["shape"]
            kind = block_format(entry["type"]) or entry["type"].lower()
            parts.append(BlockMatrix.from_file(kind, self.file.raw(entry), rows, columns, arena=self.arena))
            self.file.release(entry)
        return BlockMatrix.stack(parts) if len(parts) > 1 else parts[0]

    def biases(self, names: list[str]) -> torch.Tensor | None:
        found = [self.vector(name) for name in names]
        return None if found[0] is None else torch.cat([part.data for part in found])

    def floats(self, entry: dict) -> torch.Tensor:
        """A float matrix as stored (an embedding or head the kernel does not run in blocks)."""
        weight = self.file.floats(entry).clone()
        self.file.release(entry)
        return weight


def _fill_layer(block: nn.Module, hf: str, blocks: _BlockReader, config: ModelConfig, runner) -> None:
    """One transformer layer from the tensors under its Hugging Face prefix `hf` ("model.layers.3."), named as its
    family names them (edge.sources.loading.layer_names); a GGUF file's norms are stored as the model holds them."""
    names = layer_names(config)

    def sources(part: str, kind: str = "weight") -> list[str]:
        return [f"{hf}{name}.{kind}" for name in names[part]]

    norms = ["attn_norm", "ffn_norm"] + (["post_attn_norm", "post_ffn_norm"] if config.sandwich_norms else [])
    for part in norms:
        getattr(block, part).weight = blocks.vector(sources(part)[0])
    if config.qk_norm:
        block.attn.q_norm.weight = blocks.vector(sources("attn.q_norm")[0])
        block.attn.k_norm.weight = blocks.vector(sources("attn.k_norm")[0])
    for owner, attribute, part in ((block.attn, "wqkv", "attn.wqkv"), (block.attn, "wo", "attn.wo"),
                                   (block.ffn, "w_gate_up", "ffn.w_gate_up"), (block.ffn, "w_down", "ffn.w_down")):
        setattr(owner, attribute, BlockLinear(blocks.matrix(sources(part)), blocks.biases(sources(part, "bias")),
                                              runner))


def _fill_embedding_and_head(model: Transformer, blocks: _BlockReader, config: ModelConfig, runner) -> None:
    """The embedding and the head: in blocks where the kernel runs their type, else float; a tied head scores with
    the embedding's matrix."""
    embedding = blocks.entries["model.embed_tokens.weight"]
    if block_format(embedding["type"]):
        model.embed = BlockEmbedding(blocks.matrix(["model.embed_tokens.weight"]))
    else:
        weight = blocks.floats(embedding)
        model.embed = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight.requires_grad_(False))
    head = blocks.entries.get("lm_head.weight")
    if head is None:  # tied: the embedding's matrix scores the rows
        model.packed_head = model.embed.matrix if isinstance(model.embed, BlockEmbedding) else None
    elif block_format(head["type"]):
        model.lm_head = BlockLinear(blocks.matrix(["lm_head.weight"]), None, runner)
        model.packed_head = model.lm_head.matrix
    else:
        model.lm_head.weight = nn.Parameter(blocks.floats(head), requires_grad=False)
