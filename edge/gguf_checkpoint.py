"""GGUF files (llama.cpp's format) as edge checkpoint folders, converted once into the cache.

    folder = checkpoint_from_gguf(Path("tinyllama-1.1b-chat.Q4_0.gguf"))
    engine = Engine.load(folder)         # Engine.load("....gguf") does both; so do edge-chat, edge-bench, edge-export

The file is read with the `gguf` package's memory-mapped reader and written, one tensor at a time, as a Hugging
Face checkpoint folder: config.json from the `{arch}.*` metadata, model.safetensors, and tokenizer.json plus
tokenizer_config.json from the `tokenizer.ggml.*` keys (edge/gguf_tokenizer.py). The loader, the planner, the
drafters and the exporter then work on it as on any folder. Families: llama (Llama 2/3.x, TinyLlama, SmolLM,
Mistral), qwen2 and qwen3 (dense models).

Weights:
- float32, float16 and bfloat16 matrices are kept as stored. 1-D tensors (norms), which llama.cpp keeps in float32,
  are stored in the matrices' dtype when that is exact, else the whole folder is float32: the folder holds the
  file's numbers, bit for bit.
- Quantized matrices (q8_0, q4_0, and the other formats `gguf.quants` dequantizes: q4_k, q6_k, ...) are dequantized
  and stored in float16, within float16's rounding (2^-11 relative; a 32nd of a q8_0 step at most) of the values
  the file describes. edge runs them as a 16-bit model; `--weights int8` / `int4` requantizes them for edge's
  kernel, which brings memory near the file's size (as a slightly different model: edge's formats are not
  llama.cpp's).
- llama.cpp permutes the q and k rows of a Llama layer for its rotary layout (convert_hf_to_gguf.py,
  LlamaModel.permute); they are put back in Hugging Face order.
- A Llama 3 `rope_freqs` tensor becomes config.json's llama3 rope_scaling, checked against the frequencies edge
  computes from it.

The folder lives in ~/.cache/edge/gguf-checkpoints/<key>/<file stem>/ (or under $EDGE_CACHE_DIR), keyed by the
file's path, size and modification time; it is written to a temporary folder and renamed into place, so an
interrupted conversion leaves nothing a later load would read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from edge.config import ModelConfig
from edge.errors import CheckpointError, EdgeError, UnsupportedModelError
from edge.gguf_tokenizer import TokenizerFiles
from edge.rope import inverse_frequencies
from kernels.cache import cache_folder

CONVERTER_VERSION = 1  # part of the cache key: a change in what a conversion writes redoes old conversions
CHUNK_ELEMENTS = 1 << 24  # rows are dequantized and written this many values at a time (64 MiB of float32)


@dataclass(frozen=True)
class Family:
    architecture: str  # config.json's "architectures"
    rotary_permuted: bool  # llama.cpp stores q/k rows permuted for its rotary layout (convert_hf_to_gguf.py)


# general.architecture -> the Hugging Face family it was converted from
FAMILIES = {
    "llama": Family("LlamaForCausalLM", rotary_permuted=True),
    "qwen2": Family("Qwen2ForCausalLM", rotary_permuted=False),
    "qwen3": Family("Qwen3ForCausalLM", rotary_permuted=False),
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_TENSORS = {  # blk.N.<name> -> model.layers.N.<name>
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_SAFETENSORS_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def converted_root() -> Path:
    return cache_folder("gguf-checkpoints")


def checkpoint_from_gguf(path: str | Path, *, report: Callable[[str], None] | None = None) -> Path:
    """The checkpoint folder converted from the GGUF file at `path`: from the cache, or converted now (`report`
    gets one line saying so)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as error:
        raise CheckpointError(f"cannot read {path}: {error.strerror or error}; pass an existing .gguf file") from None
    source = path.resolve()
    key = hashlib.sha256(f"{CONVERTER_VERSION}\0{source}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    name = re.sub(r"[^\w.-]+", "-", path.stem).strip(".-") or "model"
    root = converted_root()
    final = root / key[:20]
    if (final / name / "config.json").is_file():
        return final / name
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(root)
        scratch = Path(tempfile.mkdtemp(prefix=f"{key[:20]}.", suffix=".partial", dir=root))
    except OSError as error:
        raise CheckpointError(f"cannot write the converted checkpoint under {root} ({error.strerror or error}); "
                              "make it writable or set EDGE_CACHE_DIR to a writable folder") from None
    try:
        reader = _open(path)
        if report is not None:
            report(f"converting {path.name} ({_file_type(reader)}, {stat.st_size / 2**20:.0f} MiB) once into "
                   f"{final / name}; later loads read it from there")
        convert_gguf(path, scratch / name, reader=reader)
        try:
            os.rename(scratch, final)
        except OSError:
            if not (final / name / "config.json").is_file():  # else another process finished the same conversion
                raise
    except EdgeError:  # a CheckpointError is an OSError too: keep its own message
        raise
    except OSError as error:
        raise CheckpointError(f"cannot write the converted checkpoint under {root} ({error.strerror or error}); "
                              "free disk space or set EDGE_CACHE_DIR to a folder with room") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final / name


def _remove_abandoned(root: Path, age_s: float = 86400.0) -> None:
    """Remove conversions left half-written a day ago or more (by a killed process)."""
    for partial in root.glob("*.partial"):
        try:
            if time.time() - partial.stat().st_mtime > age_s:
                shutil.rmtree(partial, ignore_errors=True)
        except OSError:
            pass


def convert_gguf(path: str | Path, folder: Path, *, reader: Any = None) -> dict:
    """Write the checkpoint folder of the GGUF file at `path` (`reader`: the file already open with
    gguf.GGUFReader) into `folder`, which must not exist; returns its config.json."""
    reader = reader if reader is not None else _open(Path(path))
    source_name = Path(path).name
    metadata = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    arch = metadata.get("general.architecture")
    family = FAMILIES.get(arch)
    if family is None:
        raise UnsupportedModelError(f"{source_name} holds a {arch!r} model; edge runs the GGUF architectures "
                                    f"{', '.join(sorted(FAMILIES))} (load another file or the original checkpoint)")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    plan = _plan(tensors, metadata, family, source_name)
    dtype = _storage_dtype(plan)
    tokenizer = TokenizerFiles.from_metadata(metadata)
    config = _config(metadata, arch, family, tensors, tokenizer, dtype, source_name)
    folder.mkdir(parents=True)
    _write_json(folder / "config.json", config)
    _write_json(folder / "tokenizer.json", tokenizer.tokenizer_json)
    _write_json(folder / "tokenizer_config.json", tokenizer.tokenizer_config)
    _write_safetensors(folder / "model.safetensors", plan, dtype)
    return config


# ---- reading ------------------------------------------------------------------------------------------------


def _open(path: Path):
    from gguf import GGUFReader  # the gguf package costs ~0.2 s to import; only GGUF files need it

    try:
        return GGUFReader(path)
    except (ValueError, IndexError, OSError, struct.error, UnicodeDecodeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path} is not a readable GGUF file ({reason}); download it again") from None


def _file_type(reader) -> str:
    """The file's precision as llama.cpp names it: f32, f16, q8_0, q4_0, q4_k_m, ..."""
    from gguf import LlamaFileType

    field = reader.fields.get("general.file_type")
    try:
        return LlamaFileType(field.contents()).name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
    except (AttributeError, ValueError, TypeError):
        kinds = {tensor.tensor_type.name.lower() for tensor in reader.tensors if len(tensor.shape) == 2}
        return "+".join(sorted(kinds)) or "unknown"


@dataclass
class _Entry:
    """One Hugging Face tensor of the folder and where its values come from."""

    name: str
    tensor: Any  # gguf ReaderTensor
    heads: int | None = None  # q/k rows to put back from llama.cpp's rotary order, in this many heads

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(size) for size in reversed(self.tensor.shape.tolist()))  # ggml lists ne0 (columns) first

    @property
    def kind(self) -> str:
        return self.tensor.tensor_type.name


def _plan(tensors: dict, metadata: dict, family: Family, source_name: str) -> list[_Entry]:
    arch = metadata["general.architecture"]
    heads = _number(metadata, arch, "attention.head_count", source_name)
    kv_heads = _number(metadata, arch, "attention.head_count_kv", source_name, default=heads)
    plan = []
    for name, tensor in tensors.items():
        stem, _, suffix = name.rpartition(".")
        block = _BLOCK_NAME.fullmatch(name)
        if name == "rope_freqs.weight":
            continue  # read into config.json's rope_scaling
        if stem in GLOBAL_TENSORS and suffix == "weight":
            plan.append(_Entry(f"{GLOBAL_TENSORS[stem]}.weight", tensor))
        elif block and block.group(2) in BLOCK_TENSORS:
            layer, part, kind = block.groups()
            permuted = {"attn_q": heads, "attn_k": kv_heads}.get(part) if family.rotary_permuted else None
            plan.append(_Entry(f"model.layers.{layer}.{BLOCK_TENSORS[part]}.{kind}", tensor, permuted))
        else:
            raise UnsupportedModelError(f"{source_name} has a tensor {name!r} that a dense {arch} model does not "
                                        "(a mixture of experts or another variant?); edge cannot run this file")
        if tensor.tensor_type.name not in _STORED and len(tensor.shape) != 2:
            raise UnsupportedModelError(f"{source_name}: tensor {name} is a quantized {len(tensor.shape)}-D "
                                        "tensor; edge reads quantized matrices only")
    if "token_embd.weight" not in tensors:
        raise CheckpointError(f"{source_name} has no token_embd.weight; the file is incomplete, download it again")
    return plan


def _storage_dtype(plan: list[_Entry]) -> torch.dtype:
    """float32, float16 or bfloat16 when every matrix is stored so and the 1-D tensors narrow to it exactly;
    float16 when matrices are quantized; float32 when a float file's norms would lose bits in its matrices'
    dtype."""
    matrix_kinds = {entry.kind for entry in plan if len(entry.shape) == 2}
    if len(matrix_kinds) == 1 and next(iter(matrix_kinds)) in _STORED:
        dtype = _STORED[next(iter(matrix_kinds))]
        for entry in plan:
            if len(entry.shape) == 1 and entry.kind == "F32":
                values = torch.from_numpy(np.array(entry.tensor.data, dtype=np.float32))
                if not torch.equal(values.to(dtype).float(), values):
                    return torch.float32
        return dtype
    return torch.float16


def _number(metadata: dict, arch: str, key: str, source_name: str, default: Any = None) -> Any:
    value = metadata.get(f"{arch}.{key}", default)
    if value is None:
        raise CheckpointError(f"{source_name} lacks the metadata key {arch}.{key} that a {arch} model needs; the "
                              "file is incomplete, convert it again")
    if isinstance(value, list):
        raise UnsupportedModelError(f"{source_name} gives {arch}.{key} per layer; edge runs models whose layers "
                                    "all have the same shape")
    return value


def _float32_value(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


# ---- config.json --------------------------------------------------------------------------------------------


def _config(metadata: dict, arch: str, family: Family, tensors: dict, tokenizer: TokenizerFiles,
            dtype: torch.dtype, source_name: str) -> dict:
    def number(key: str, default: Any = None) -> Any:
        return _number(metadata, arch, key, source_name, default)

    hidden, heads = number("embedding_length"), number("attention.head_count")
    head_dim = number("attention.key_length", hidden // heads)
    vocab_size = int(tensors["token_embd.weight"].shape[1])
    config = {
        "architectures": [family.architecture],
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": number("feed_forward_length"),
        "num_hidden_layers": number("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": number("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": _float32_value(number("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _float32_value(number("rope.freq_base", 10000.0)),
        "max_position_embeddings": number("context_length", 2048),
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_gate.bias" in tensors,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_ids,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "gguf_source": source_name,
    }
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    linear = metadata.get(f"{arch}.rope.scale_linear")
    if scaling == "linear" or (scaling is None and linear):
        factor = metadata.get(f"{arch}.rope.scaling.factor", linear)
        config["rope_scaling"] = {"rope_type": "linear", "factor": _float32_value(factor)}
    elif scaling not in (None, "none"):
        raise UnsupportedModelError(f"{source_name} uses {scaling!r} rope scaling; edge supports linear and "
                                    "Llama 3's (rope_freqs)")
    if "rope_freqs.weight" in tensors:
        factors = np.array(tensors["rope_freqs.weight"].data, dtype=np.float32)
        original = metadata.get(f"{arch}.rope.scaling.original_context_length", 8192)
        config["rope_scaling"] = _llama3_scaling(config, factors, original, source_name)
    ModelConfig.from_hf(config, source=source_name)  # the one reader of config.json says it is complete
    return config


def _llama3_scaling(config: dict, factors: np.ndarray, original: int, source_name: str) -> dict | None:
    """Llama 3's rope_scaling whose frequencies are the base frequencies divided by `factors` (llama.cpp's
    rope_freqs). The file keeps only the factors; low_freq_factor and high_freq_factor are read back from where
    the factors leave 1 and reach their maximum (Meta's 1 and 4 when they fit), and the result is checked against
    the frequencies edge computes from it."""
    factor = float(factors.max())
    if factor == 1.0:
        return None
    base = inverse_frequencies(ModelConfig.from_hf({**config, "rope_scaling": None})).numpy()  # (D/2,)
    position = original * base / (2 * math.pi)  # original context / wavelength
    wanted = base / factors
    candidates = [(1.0, 4.0), _fitted_band(position, factors, factor)]
    for low, high in candidates:
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                   "original_max_position_embeddings": original}
        got = inverse_frequencies(ModelConfig.from_hf({**config, "rope_scaling": scaling})).numpy()
        if np.allclose(got, wanted, rtol=2e-6, atol=0):
            return scaling
    raise UnsupportedModelError(f"{source_name}'s rope_freqs are not a Llama 3 frequency scaling edge can express; "
                                "load the original checkpoint folder instead")


def _fitted_band(position: np.ndarray, factors: np.ndarray, factor: float) -> tuple[float, float]:
    """low/high_freq_factor from the factors: s = (1/f - 1/factor) / (1 - 1/factor) rises linearly from 0 at
    low_freq_factor to 1 at high_freq_factor over `position`; kept frequencies lie above the band, divided ones
    below it."""
    kept, divided = factors <= 1.0, factors >= factor
    band = ~(kept | divided)
    below = position[divided].max() if divided.any() else 0.0
    above = position[kept].min() if kept.any() else position.max() * 2 + 1
    share = (1 / factors[band] - 1 / factor) / (1 - 1 / factor)
    if band.sum() >= 2:
        slope, intercept = np.polyfit(position[band], share, 1)
        low = -intercept / slope
        return float(low), float(low + 1 / slope)
    if band.sum() == 1:
        at, s = float(position[band][0]), float(share[0])
        width = min(at - below, above - at)
        return at - s * width, at + (1 - s) * width
    return float(below + (above - below) / 3), float(below + 2 * (above - below) / 3)


# ---- writing ------------------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_safetensors(path: Path, plan: list[_Entry], dtype: torch.dtype) -> None:
    """A safetensors file written one tensor (and for big ones, one slab of rows) at a time: peak memory is one
    tensor, not the model."""
    header, offset = {}, 0
    for entry in plan:
        size = math.prod(entry.shape) * dtype.itemsize
        header[entry.name] = {"dtype": _SAFETENSORS_NAMES[dtype], "shape": list(entry.shape),
                              "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for entry in plan:
            for values in _values(entry, dtype):
                handle.write(values.contiguous().view(torch.uint8).numpy().data)


def _values(entry: _Entry, dtype: torch.dtype) -> Iterator[torch.Tensor]:
    """The entry's values in `dtype`, in slabs of rows (whole, when the rows must be permuted back)."""
    data = entry.tensor.data
    rows = entry.shape[0]
    step = rows if entry.heads is not None or len(entry.shape) == 1 else max(1, CHUNK_ELEMENTS // entry.shape[1])
    for start in range(0, rows, step):
        values = _decoded(data[start:start + step], entry.tensor.tensor_type)
        if entry.heads is not None:
            values = _unpermute(values, entry.heads)
        narrowed = values.to(dtype)
        if dtype != values.dtype and not torch.isfinite(narrowed).all() and torch.isfinite(values).all():
            raise UnsupportedModelError(f"tensor {entry.name} has values beyond {dtype}'s range; edge cannot "
                                        "store this file's weights in 16 bits")
        yield narrowed


def _decoded(block: np.ndarray, kind) -> torch.Tensor:
    """Rows of a GGUF tensor as a torch tensor: float types as stored, quantized ones dequantized to float32."""
    from gguf.quants import dequantize

    if kind.name in ("F32", "F16"):
        return torch.from_numpy(np.array(block))
    if kind.name == "BF16":
        return torch.from_numpy(np.array(block).view(np.int16)).view(torch.bfloat16)
    try:
        return torch.from_numpy(dequantize(np.array(block), kind))
    except NotImplementedError:
        raise UnsupportedModelError(f"the gguf package cannot dequantize {kind.name} tensors; use a file in f16, "
                                    "q8_0, q4_0 or a k-quant") from None


def _unpermute(values: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's LlamaModel.permute: within each head, rows (2, D/2) were interleaved as (D/2, 2)."""
    shape = values.shape  # (H * D, ...) rows of a q or k projection (or its bias)
    return values.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).transpose(1, 2).reshape(shape)
