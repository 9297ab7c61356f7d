"""GGUF files (llama.cpp's format) as edge checkpoint folders: what loading needs, read once into the cache.

    folder = checkpoint_from_gguf(Path("tinyllama-1.1b-chat.Q4_K_M.gguf"))
    engine = Engine.load(folder)         # Engine.load("....gguf") does both; so do edge-chat, edge-bench, edge-serve

The file's header is read once with the `gguf` package and written as a small folder: config.json from the
`{arch}.*` metadata, tokenizer.json and tokenizer_config.json from the `tokenizer.ggml.*` keys
(edge/sources/gguf_tokenizer.py), generation_config.json from the `general.sampling.*` keys where the file has them
(the model's recommended sampling: edge/sources/sampling_config.py), and gguf.json, the file's path and its tensors'
names, types, shapes and byte offsets.
The weights stay in the file: edge/sources/gguf_weights.py maps them from there at each load, in their own quantization.
Families: llama (Llama 2/3.x, TinyLlama, SmolLM, Mistral), qwen2 and qwen3 (dense models), gemma3 (Gemma 3 text) and
phi3 (Phi-3, Phi-3.5-mini, Phi-4-mini).

Before anything is written the file is checked whole: its header's counts and lengths against the file's size
(edge/sources/gguf_header.py, before the `gguf` package's reader walks them), every metadata value a model needs,
every tensor of every layer with the shape the metadata implies, every byte range inside the file. A file that fails is never cached, and
the error names what is wrong with it.

- llama.cpp permutes the q and k rows of a Llama layer for its rotary layout (convert_hf_to_gguf.py,
  LlamaModel.permute); the index records the head count, and loading puts the rows back in Hugging Face order
  (whole rows: a quantized row keeps its bytes).
- A Llama 3 `rope_freqs` tensor becomes config.json's llama3 rope_scaling, checked against the frequencies edge
  computes from it; Phi-3's `rope_factors_short` / `rope_factors_long` become its LongRoPE rope_scaling.
- Gemma 3: llama.cpp's converter stores every norm weight as 1 + w (Gemma's checkpoints store w for a norm that scales
  by 1 + w), which is what edge's model holds, so they load as stored. llama.cpp knows the rest of Gemma 3 from the
  architecture alone (a global layer every sixth, the local layers' rope base 10000, scores scaled by head size ** -0.5,
  by (hidden / heads) ** -0.5 for the 27B) unless the file says otherwise (attention.sliding_window_pattern, rope.freq_base_swa, attention.scale); so does
  this reader.
- Phi-3: q/k/v are one tensor (attn_qkv) and ffn_up holds gate and up (2 x feed_forward_length rows), as in the
  Hugging Face checkpoint; rope.dimension_count gives the rotary dims (Phi-4-mini rotates 3/4 of each head).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge.model.config import ModelConfig
from edge.errors import CheckpointError, EdgeError, UnsupportedModelError
from edge.sources.gguf_header import HeaderError, check_header
from edge.sources.gguf_tokenizer import TokenizerFiles
from edge.sources.sampling_config import gguf_generation_config
from edge.model.rope import inverse_frequencies
from edge.kernels.cache import cache_folder

CONVERTER_VERSION = 3  # part of the cache key: a change in what a conversion writes redoes old conversions
INDEX_FILE = "gguf.json"  # the file's path and tensor table, beside config.json and the tokenizer


GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_TENSORS = {  # blk.N.<name> -> model.layers.N.<name>
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
REQUIRED = frozenset({"attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                      "ffn_down"})  # each layer's weights, by GGUF name


@dataclass(frozen=True)
class Family:
    architecture: str  # config.json's "architectures"
    rotary_permuted: bool  # llama.cpp stores q/k rows permuted for its rotary layout (convert_hf_to_gguf.py)
    tensors: dict = field(default_factory=lambda: BLOCK_TENSORS)  # blk.N.<name> -> model.layers.N.<name>
    required: frozenset = REQUIRED  # the weights every layer has
    config: Callable[[dict, str, dict, dict, str], dict] | None = None  # the family's own config.json keys


def _gemma3_config(metadata: dict, arch: str, shape: dict, tensors: dict, source_name: str) -> dict:
    """Gemma 3's keys llama.cpp does not write, as llama.cpp assumes them (src/llama-model.cpp): a global layer every
    sixth, the local layers' rope base 10000, scores scaled by head size ** -0.5 (27B: _query_scalar); a file's own
    keys win."""
    layers = shape["layers"]
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per layer: True where it is windowed
        local = [bool(value) for value in pattern]
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        local = [bool((i + 1) % pattern) for i in range(layers)]
    else:
        local = []
    if len(local) != layers:
        raise CheckpointError(f"{source_name}: {arch}.attention.sliding_window_pattern is {pattern!r}, which does "
                              f"not describe {layers} layers; the file is damaged or mis-converted")
    scale = metadata.get(f"{arch}.attention.scale")
    return {
        "sliding_window": _number(metadata, arch, "attention.sliding_window", source_name),
        "layer_types": ["sliding_attention" if windowed else "full_attention" for windowed in local],
        "rope_local_base_freq": _float32_value(metadata.get(f"{arch}.rope.freq_base_swa", 10000.0)),
        "rope_theta": _float32_value(_number(metadata, arch, "rope.freq_base", source_name, 1_000_000.0)),
        "query_pre_attn_scalar": _float32_value(scale) ** -2 if scale else _query_scalar(shape),
        "final_logit_softcapping": metadata.get(f"{arch}.final_logit_softcapping"),
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _query_scalar(shape: dict) -> int:
    """Gemma 3's query_pre_attn_scalar as llama.cpp assumes it: the head size, but hidden / heads for the 27B model
    (62 layers: 168, where its heads are 128 wide)."""
    return shape["hidden"] // shape["heads"] if shape["layers"] == 62 else shape["head_dim"]


def _phi3_config(metadata: dict, arch: str, shape: dict, tensors: dict, source_name: str) -> dict:
    """Phi-3's rotary dims and LongRoPE factors (convert_hf_to_gguf.py's Phi3MiniModel; a sliding_window of 0 is
    Phi-4-mini's none)."""
    rotary = _number(metadata, arch, "rope.dimension_count", source_name, shape["head_dim"])
    window = metadata.get(f"{arch}.attention.sliding_window") or None
    extra = {"partial_rotary_factor": rotary / shape["head_dim"], "sliding_window": window}
    if "rope_factors_short.weight" in tensors or "rope_factors_long.weight" in tensors:
        factors = {name: np.array(tensors[f"rope_factors_{name}.weight"].data, dtype=np.float32).tolist()
                   for name in ("short", "long") if f"rope_factors_{name}.weight" in tensors}
        if len(factors) != 2 or any(len(values) != rotary // 2 for values in factors.values()):
            raise CheckpointError(f"{source_name}: its rope_factors_short and rope_factors_long must both hold "
                                  f"{rotary // 2} factors; the file is damaged or mis-converted")
        original = _number(metadata, arch, "rope.scaling.original_context_length", source_name)
        extra["original_max_position_embeddings"] = original
        extra["rope_scaling"] = {"rope_type": "longrope", "short_factor": factors["short"],
                                 "long_factor": factors["long"], "original_max_position_embeddings": original}
        attn_factor = metadata.get(f"{arch}.rope.scaling.attn_factor")
        if attn_factor is not None:
            extra["rope_scaling"]["attention_factor"] = _float32_value(attn_factor)
    return extra


# general.architecture -> the Hugging Face family it was converted from
FAMILIES = {
    "llama": Family("LlamaForCausalLM", rotary_permuted=True),
    "qwen2": Family("Qwen2ForCausalLM", rotary_permuted=False),
    "qwen3": Family("Qwen3ForCausalLM", rotary_permuted=False),
    "gemma3": Family("Gemma3ForCausalLM", rotary_permuted=False, tensors={
        **BLOCK_TENSORS, "ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm"},
        required=REQUIRED | {"post_attention_norm", "post_ffw_norm", "attn_q_norm", "attn_k_norm"},
        config=_gemma3_config),
    "phi3": Family("Phi3ForCausalLM", rotary_permuted=False, tensors={
        **BLOCK_TENSORS, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
        required=REQUIRED - {"attn_q", "attn_k", "attn_v", "ffn_gate"} | {"attn_qkv"}, config=_phi3_config),
}
EXTRA_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")  # read into config
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
FLOAT_TYPES = ("F32", "F16", "BF16")


def converted_root() -> Path:
    return cache_folder("gguf-checkpoints")


def checkpoint_from_gguf(path: str | Path, *, report: Callable[[str], None] | None = None) -> Path:
    """The checkpoint folder read from the GGUF file at `path`: from the cache, or read now (`report` gets one line
    saying so)."""
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
    if (final / name / INDEX_FILE).is_file():
        return final / name
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(root)
        scratch = Path(tempfile.mkdtemp(prefix=f"{key[:20]}.", suffix=".partial", dir=root))
    except OSError as error:
        raise CheckpointError(f"cannot write the model's settings under {root} ({error.strerror or error}); "
                              "make it writable or set EDGE_CACHE_DIR to a writable folder") from None
    try:
        reader = _open(path)
        if report is not None:
            report(f"reading {path.name} ({_file_type(reader)}, {stat.st_size / 2**20:.0f} MiB) once: its settings "
                   f"and tokenizer go to {final / name}; the weights stay in the file")
        convert_gguf(path, scratch / name, reader=reader, report=report)
        try:
            os.rename(scratch, final)
        except OSError:
            if not (final / name / INDEX_FILE).is_file():  # else another process finished the same conversion
                raise
    except EdgeError:  # a CheckpointError is an OSError too: keep its own message
        raise
    except OSError as error:
        raise CheckpointError(f"cannot write the model's settings under {root} ({error.strerror or error}); "
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


def convert_gguf(path: str | Path, folder: Path, *, reader: Any = None,
                 report: Callable[[str], None] | None = None) -> dict:
    """Write the checkpoint folder of the GGUF file at `path` (`reader`: the file already open with
    gguf.GGUFReader) into `folder`, which must not exist, after checking the file whole; returns its config.json.
    `report` gets a line for each special token id the file names outside its vocabulary (ignored)."""
    path = Path(path)
    reader = reader if reader is not None else _open(path)
    source_name = path.name
    metadata = {name: _contents(field) for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    arch = metadata.get("general.architecture")
    family = FAMILIES.get(arch)
    if family is None:
        raise UnsupportedModelError(f"{source_name} holds a {arch!r} model; edge runs the GGUF architectures "
                                    f"{', '.join(sorted(FAMILIES))} (load another file or the original checkpoint)")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    shape = _shape(metadata, arch, tensors, source_name)
    entries = _index(tensors, shape, family, path.stat().st_size, source_name)
    tokenizer = TokenizerFiles.from_metadata(metadata)
    if len(tokenizer.tokenizer_json["model"]["vocab"]) > shape["vocab"]:
        raise CheckpointError(f"{source_name}: its tokenizer has {len(tokenizer.tokenizer_json['model']['vocab'])} "
                              f"tokens but token_embd.weight only {shape['vocab']} rows; the file is damaged or "
                              "mis-converted: download it again")
    if report is not None and tokenizer.ignored:
        ending = "" if tokenizer.eos_token_ids else ("; no token ends its replies, so they run to --max-new-tokens "
                                                    "or a stop string")
        report(f"note: {source_name} names {', '.join(tokenizer.ignored)} outside its vocabulary of "
               f"{len(metadata.get('tokenizer.ggml.tokens') or []):,} tokens; ignored{ending}")
    config = _config(metadata, arch, family, shape, tensors, tokenizer, source_name)
    folder.mkdir(parents=True)
    _write_json(folder / "config.json", config)
    _write_json(folder / "tokenizer.json", tokenizer.tokenizer_json)
    _write_json(folder / "tokenizer_config.json", tokenizer.tokenizer_config)
    sampling = gguf_generation_config(metadata)  # the model's recommended sampling (general.sampling.*), if any
    if sampling is not None:
        _write_json(folder / "generation_config.json", sampling)
    stat = path.stat()
    _write_json(folder / INDEX_FILE, {"file": str(path.resolve()), "size": stat.st_size,
                                      "mtime_ns": stat.st_mtime_ns, "file_type": _file_type(reader),
                                      "tensors": entries})
    return config


# ---- reading ------------------------------------------------------------------------------------------------


def _open(path: Path):
    from gguf import GGUFReader  # the gguf package costs ~0.2 s to import; only GGUF files need it

    try:
        check_header(path)  # before the reader, which would walk a damaged array's count item by item
    except HeaderError as error:
        raise CheckpointError(f"{path} is not a readable GGUF file ({error}); download it again") from None
    try:
        reader = GGUFReader(path)
        _ = [(tensor.name, tensor.tensor_type) for tensor in reader.tensors]
        return reader
    except (ValueError, IndexError, KeyError, OSError, struct.error, UnicodeDecodeError, OverflowError,
            TypeError) as error:
        raise CheckpointError(f"{path} is not a readable GGUF file ({_reason(error)}); download it again") from None


def _reason(error: Exception) -> str:
    """A reader's failure in a few words: numpy's own messages (an index out of bounds, a buffer too small) all mean
    the file ends before what its header describes."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if "larger dtype" in text or "divisor of the total size" in text:  # a tensor's bytes cut short by the file's end
        return "it is truncated: it ends inside the tensor data its header describes"
    if isinstance(error, (IndexError, struct.error)) or "out of bounds" in text or "buffer" in text or \
            "mmap" in text or "cannot reshape" in text:
        return "it ends before the header it starts with, or that header is damaged"
    if isinstance(error, KeyError) or "is not a valid" in text:
        return f"an unknown value in its header: {text}"
    return text[:160]


def _contents(field) -> Any:
    try:
        return field.contents()
    except (ValueError, IndexError, TypeError, UnicodeDecodeError):
        return None


def _file_type(reader) -> str:
    """The file's precision as llama.cpp names it: f32, f16, q8_0, q4_0, q4_k_m, ..."""
    from gguf import LlamaFileType

    field = reader.fields.get("general.file_type")
    try:
        return LlamaFileType(field.contents()).name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
    except (AttributeError, ValueError, TypeError):
        kinds = {tensor.tensor_type.name.lower() for tensor in reader.tensors if len(tensor.shape) == 2}
        return "+".join(sorted(kinds)) or "unknown"


def _number(metadata: dict, arch: str, key: str, source_name: str, default: Any = None, *,
            positive: bool = True) -> Any:
    value = metadata.get(f"{arch}.{key}", default)
    if value is None:
        raise CheckpointError(f"{source_name} lacks the metadata key {arch}.{key} that a {arch} model needs; the "
                              "file is incomplete, convert it again")
    if isinstance(value, list):
        raise UnsupportedModelError(f"{source_name} gives {arch}.{key} per layer; edge runs models whose layers "
                                    "all have the same shape")
    if positive and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
                     or (isinstance(value, float) and not math.isfinite(value))):
        raise CheckpointError(f"{source_name}: metadata {arch}.{key} is {value!r}, which no model has (it must be a "
                              "positive number); the file is damaged or mis-converted: download it again")
    return value


def _shape(metadata: dict, arch: str, tensors: dict, source_name: str) -> dict:
    """The sizes the metadata gives, checked against each other and the embedding."""
    def number(key: str, default: Any = None) -> Any:
        return _number(metadata, arch, key, source_name, default)

    hidden, heads, layers = number("embedding_length"), number("attention.head_count"), number("block_count")
    kv_heads, inner = number("attention.head_count_kv", heads), number("feed_forward_length")
    if not all(isinstance(value, int) for value in (hidden, heads, layers, kv_heads, inner)):
        raise CheckpointError(f"{source_name}: the {arch}.* sizes must be whole numbers; the file is damaged")
    if "attention.key_length" not in str(metadata.keys()) and hidden % heads:
        raise CheckpointError(f"{source_name}: embedding_length {hidden} is not a multiple of head_count {heads} "
                              "and the file gives no attention.key_length; the file is damaged")
    head_dim = number("attention.key_length", hidden // heads)
    if heads % kv_heads or head_dim % 2:
        raise CheckpointError(f"{source_name}: head_count {heads}, head_count_kv {kv_heads} and head size "
                              f"{head_dim} do not make an attention layer; the file is damaged")
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise CheckpointError(f"{source_name} has no token_embd.weight; the file is incomplete, download it again")
    dims = [int(size) for size in reversed(embedding.shape.tolist())]  # rows first; ggml lists columns first
    if 0 in dims:
        raise CheckpointError(f"{source_name}: token_embd.weight is {dims}, with a dimension of 0 (no tokens or no "
                              "width); the file is damaged or mis-converted: download it again")
    vocab, columns = dims if len(dims) == 2 else (0, 0)
    if columns != hidden:
        raise CheckpointError(f"{source_name}: token_embd.weight is {dims} but embedding_length is {hidden}; the "
                              "file is damaged or mis-converted")
    return {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "inner": inner,
            "layers": layers, "vocab": vocab}


def _index(tensors: dict, shape: dict, family: Family, file_size: int, source_name: str) -> list[dict]:
    """Every tensor the model reads, under its Hugging Face name, checked: known, where the metadata says it should
    be, of the shape it implies, its bytes inside the file; and every layer complete."""
    expected, biases, globals_ = _expected_shapes(shape, family)
    entries, layers_seen = [], {}
    for name, tensor in tensors.items():
        stem, _, suffix = name.rpartition(".")
        block = _BLOCK_NAME.fullmatch(name)
        if name in EXTRA_TENSORS:
            continue  # read into config.json's rope_scaling
        heads = None
        if stem in GLOBAL_TENSORS and suffix == "weight":
            hf_name, wanted = f"{GLOBAL_TENSORS[stem]}.weight", globals_[stem]
        elif block and block.group(2) in family.tensors:
            layer, part, kind = block.groups()
            if int(layer) >= shape["layers"]:
                raise CheckpointError(f"{source_name} has tensor {name} but block_count is {shape['layers']}; the "
                                      "file is damaged or mis-converted: download it again")
            wanted = expected[part] if kind == "weight" else biases.get(part)
            if wanted is None:
                raise UnsupportedModelError(f"{source_name} has a tensor {name!r} that a dense model does not; edge "
                                            "cannot run this file")
            layers_seen.setdefault(int(layer), set()).add(f"{part}.{kind}")
            if family.rotary_permuted and part in ("attn_q", "attn_k"):
                heads = shape["heads"] if part == "attn_q" else shape["kv_heads"]
            hf_name = f"model.layers.{layer}.{family.tensors[part]}.{kind}"
        else:
            raise UnsupportedModelError(f"{source_name} has a tensor {name!r} that a dense model does not (a "
                                        "mixture of experts or another variant?); edge cannot run this file")
        entries.append(_entry(name, tensor, hf_name, wanted, heads, file_size, source_name))
    _check_complete(tensors, layers_seen, shape["layers"], family, source_name)
    return entries


def _expected_shapes(shape: dict, family: Family) -> tuple[dict, dict, dict]:
    """The shapes the metadata implies, by GGUF name part: each layer's weights, each layer's biases, and the
    model's own tensors (embedding, final norm, head). A family without ffn_gate (Phi-3) holds gate and up in
    ffn_up."""
    hidden, q_rows, kv_rows = shape["hidden"], shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    weights = {"attn_norm": (hidden,), "ffn_norm": (hidden,), "attn_q": (q_rows, hidden),
               "attn_k": (kv_rows, hidden), "attn_v": (kv_rows, hidden), "attn_output": (hidden, q_rows),
               "attn_q_norm": (shape["head_dim"],), "attn_k_norm": (shape["head_dim"],),
               "ffn_gate": (shape["inner"], hidden), "ffn_up": (shape["inner"], hidden),
               "ffn_down": (hidden, shape["inner"]), "attn_qkv": (q_rows + 2 * kv_rows, hidden),
               "post_attention_norm": (hidden,), "post_ffw_norm": (hidden,)}
    biases = {"attn_q": (q_rows,), "attn_k": (kv_rows,), "attn_v": (kv_rows,), "attn_output": (hidden,),
              "ffn_gate": (shape["inner"],), "ffn_up": (shape["inner"],), "ffn_down": (hidden,),
              "attn_qkv": (q_rows + 2 * kv_rows,)}
    if "ffn_gate" not in family.required:
        weights["ffn_up"], biases["ffn_up"] = (2 * shape["inner"], hidden), (2 * shape["inner"],)
    model = {"token_embd": (shape["vocab"], hidden), "output_norm": (hidden,), "output": (shape["vocab"], hidden)}
    return weights, biases, model


def _entry(name: str, tensor, hf_name: str, wanted: tuple, heads: int | None, file_size: int,
           source_name: str) -> dict:
    """The index entry of GGUF tensor `name`, checked: the shape `wanted`, a float type for a 1-D tensor, its bytes
    inside the file."""
    dims = tuple(int(size) for size in reversed(tensor.shape.tolist()))  # ggml lists ne0 (columns) first
    while len(dims) > len(wanted) and dims[0] == 1:
        dims = dims[1:]
    if 0 in dims:
        raise CheckpointError(f"{source_name}: tensor {name} is {list(dims)}, with a dimension of 0 (the metadata "
                              f"implies {list(wanted)}); the file is damaged or mis-converted: download it again")
    if dims != wanted:
        raise CheckpointError(f"{source_name}: tensor {name} is {list(dims)} but the metadata implies "
                              f"{list(wanted)}; the file is damaged or mis-converted: download it again")
    kind_name = tensor.tensor_type.name
    if len(dims) == 1 and kind_name not in FLOAT_TYPES:
        raise UnsupportedModelError(f"{source_name}: the 1-D tensor {name} is stored as {kind_name}; edge reads "
                                    "norms and biases in F32, F16 or BF16")
    offset, size = int(tensor.data_offset), int(tensor.n_bytes)
    if offset + size > file_size:
        raise CheckpointError(f"{source_name} is truncated: tensor {name} ends at byte {offset + size} of a "
                              f"{file_size}-byte file; download it again")
    return {"name": hf_name, "gguf": name, "type": kind_name, "shape": list(dims), "offset": offset, "bytes": size,
            "heads": heads}


def _check_complete(tensors: dict, layers_seen: dict[int, set[str]], layers: int, family: Family,
                    source_name: str) -> None:
    """Every one of the `layers` layers has each weight a layer of its family needs, and the file has the final
    norm."""
    required = {f"{part}.weight" for part in family.required}
    for layer in range(layers):
        missing = sorted(required - layers_seen.get(layer, set()))
        if missing:
            raise CheckpointError(f"{source_name}: layer {layer} of block_count {layers} has no "
                                  f"blk.{layer}.{missing[0]}; the file is incomplete or damaged: download it again")
    if "output_norm.weight" not in tensors:
        raise CheckpointError(f"{source_name} has no output_norm.weight; the file is incomplete, download it again")


def _float32_value(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


# ---- config.json --------------------------------------------------------------------------------------------


def _config(metadata: dict, arch: str, family: Family, shape: dict, tensors: dict, tokenizer: TokenizerFiles,
            source_name: str) -> dict:
    def number(key: str, default: Any = None) -> Any:
        return _number(metadata, arch, key, source_name, default)

    kinds = {tensor.tensor_type.name for tensor in tensors.values() if len(tensor.shape) == 2}
    config = {
        "architectures": [family.architecture],
        "model_type": arch,
        "vocab_size": shape["vocab"],
        "hidden_size": shape["hidden"],
        "intermediate_size": shape["inner"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "head_dim": shape["head_dim"],
        "rms_norm_eps": _float32_value(number("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _float32_value(number("rope.freq_base", 10000.0)),
        "max_position_embeddings": number("context_length", 2048),
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_gate.bias" in tensors,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_ids,
        # the matrices' own precision when they are all one float type; quantized files keep their blocks
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(
            next(iter(kinds)) if len(kinds) == 1 else "", "float16"),
        "gguf_source": source_name,
    }
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    linear = metadata.get(f"{arch}.rope.scale_linear")
    if scaling == "linear" or (scaling is None and linear):
        factor = metadata.get(f"{arch}.rope.scaling.factor", linear)
        config["rope_scaling"] = {"rope_type": "linear", "factor": _float32_value(factor)}
    elif scaling not in (None, "none", "longrope"):  # LongRoPE: its factors' tensors (Phi-3's family config)
        raise UnsupportedModelError(f"{source_name} uses {scaling!r} rope scaling; edge supports linear and "
                                    "Llama 3's (rope_freqs)")
    if "rope_freqs.weight" in tensors:
        factors = np.array(tensors["rope_freqs.weight"].data, dtype=np.float32)
        original = metadata.get(f"{arch}.rope.scaling.original_context_length", 8192)
        config["rope_scaling"] = _llama3_scaling(config, factors, original, source_name)
    if family.config is not None:
        config.update(family.config(metadata, arch, shape, tensors, source_name))
    ModelConfig.from_hf(config, source=source_name)  # the one reader of config.json says it is complete
    return config


def _llama3_scaling(config: dict, factors: np.ndarray, original: int, source_name: str) -> dict | None:
    """Llama 3's rope_scaling whose frequencies are the base frequencies divided by `factors` (llama.cpp's
    rope_freqs). The file keeps only the factors; low_freq_factor and high_freq_factor are read back from where
    the factors leave 1 and reach their maximum (Meta's 1 and 4 when they fit), and the result is checked against
    the frequencies edge computes from it."""
    base = inverse_frequencies(ModelConfig.from_hf({**config, "rope_scaling": None})).numpy()  # (D/2,)
    if factors.shape != base.shape:
        raise CheckpointError(f"{source_name}'s rope_freqs.weight is {list(factors.shape)}; its heads' rotary "
                              f"dimensions imply {list(base.shape)}; download it again")
    if not (np.isfinite(factors).all() and (factors > 0).all()):
        raise CheckpointError(f"{source_name}'s rope_freqs.weight holds values that are not positive numbers; "
                              "download it again")
    factor = float(factors.max())
    if factor == 1.0:
        return None
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


def gguf_index(folder: str | Path) -> dict | None:
    """The tensor index of a folder read from a GGUF file (None for any other folder), checked against the file:
    a file that changed or moved since is an error naming it."""
    index_path = Path(folder) / INDEX_FILE
    if not index_path.is_file():
        return None
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        source = Path(index["file"])
        stat = source.stat()
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"the GGUF file behind {folder} cannot be read ({getattr(error, 'strerror', None) or error}); "
                              "load the .gguf file itself again") from None
    if (stat.st_size, stat.st_mtime_ns) != (index["size"], index["mtime_ns"]):
        raise CheckpointError(f"{source} changed since {folder} was read from it; load the .gguf file itself again")
    return index
