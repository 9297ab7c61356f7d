"""Load a Hugging Face checkpoint folder into `Transformer`: safetensors only, memory-mapped, never unpickled.

Model files are untrusted input. Every safetensors header is parsed and checked here (dtype known, shape matches
the byte range, the range lies inside the file) before a tensor is viewed; pickled `.bin`/`.pt` files are refused.
Tensors whose dtype already matches are zero-copy views of a copy-on-write memory map; the q/k/v and gate/up
projections are concatenated once into the fused weights the model uses.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

from edge.config import ModelConfig
from edge.errors import CheckpointError
from edge.model import Transformer
from edge.rope import inverse_frequencies

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_HEADER_BYTES = 100 * 1024 * 1024
CONVERT_HINT = (
    "convert it once, in an environment you trust, with: python -c \"import transformers as t; "
    "t.AutoModelForCausalLM.from_pretrained('IN').save_pretrained('OUT', safe_serialization=True)\""
)


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise CheckpointError(f"unknown dtype {name!r}; use one of float32, bfloat16, float16") from None


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (one file, or the shards its index names)."""
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist; pass the folder holding config.json")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
            raise CheckpointError(f"{index} is not a valid safetensors index (no weight_map); re-save the checkpoint")
        shards = sorted(set(weight_map.values()))
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise CheckpointError(f"shard {folder / missing[0]} named by {index.name} is missing; download it again")
        return [folder / name for name in shards]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{folder / pickles[0]} is a pickle, which edge never loads (it can run code); {CONVERT_HINT}")
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {folder}; add the weights")


class MappedTensors:
    """Tensors viewed from memory maps, with the byte span each occupies, so spans can be released once copied."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._spans: dict[str, tuple[mmap.mmap, int, int]] = {}

    def add(self, name: str, tensor: torch.Tensor, buffer: mmap.mmap | None, start: int, end: int) -> None:
        self.tensors[name] = tensor
        if buffer is not None:
            self._spans[name] = (buffer, start, end)

    def release_unless_used(self, used: list[torch.Tensor]) -> None:
        """Drop the resident pages of every mapped tensor that `used` does not share storage with.

        Fused and dtype-converted weights are copies; without this, the pages read while copying them would
        stay in the process's resident memory next to the copies."""
        kept = {tensor.untyped_storage().data_ptr() for tensor in used}
        page = mmap.PAGESIZE
        for name, (buffer, start, end) in self._spans.items():
            if self.tensors[name].untyped_storage().data_ptr() in kept:
                continue
            first, last = -(-start // page) * page, end // page * page  # whole pages inside the span only
            if last > first:
                buffer.madvise(mmap.MADV_DONTNEED, first, last - first)


def read_safetensors(path: Path, into: MappedTensors) -> None:
    """Add every tensor of one file to `into`, as views of a copy-on-write memory map."""
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size < 8:
                raise CheckpointError(f"{path} is truncated ({size} bytes); download it again")
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len > min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{path} is truncated or not a safetensors file (bad header length); download it again")
            header = _parse_header(handle.read(header_len), path)
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    data_start = 8 + header_len
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensor, begin = _tensor_view(buffer, data_start, name, info, path, size)
        into.add(name, tensor, buffer if begin is not None else None, begin or 0, (begin or 0) + tensor.nbytes)


def _parse_header(raw: bytes, path: Path) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path} has a corrupt safetensors header; download it again") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a corrupt safetensors header; download it again")
    return header


def _tensor_view(
    buffer: mmap.mmap, data_start: int, name: str, info: dict, path: Path, size: int
) -> tuple[torch.Tensor, int | None]:
    """The tensor and its offset in the map (None when it had to be copied out)."""
    try:
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        shape = [int(dim) for dim in info["shape"]]
        begin, end = (int(offset) for offset in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: tensor {name!r} has an unsupported or malformed entry {info!r}") from None
    count = 1
    for dim in shape:
        count *= dim
    itemsize = torch.empty((), dtype=dtype).element_size()
    if end - begin != count * itemsize or begin < 0:
        raise CheckpointError(f"{path}: tensor {name!r} byte range does not match its shape {shape}; the file is corrupt")
    if data_start + end > size:
        raise CheckpointError(f"{path} is truncated: tensor {name!r} ends past the end of the file; download it again")
    if count == 0:
        return torch.empty(shape, dtype=dtype), None
    offset = data_start + begin
    if offset % itemsize:  # unaligned: copy rather than view
        return torch.frombuffer(bytearray(buffer[offset : offset + end - begin]), dtype=dtype).reshape(shape), None
    return torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape), offset


def load_hf_tensors(folder: Path) -> MappedTensors:
    mapped = MappedTensors()
    for path in weight_files(folder):
        read_safetensors(path, mapped)
    return mapped


def to_edge_names(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Map Hugging Face tensor names to the model's, fusing q/k/v and gate/up."""

    def take(name: str) -> torch.Tensor:
        try:
            return hf[name]
        except KeyError:
            raise CheckpointError(f"checkpoint lacks tensor {name!r} that {config.architecture} needs; is it complete?") from None

    state = {"embed.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = take("lm_head.weight")
    for i in range(config.num_layers):
        hf_prefix, prefix = f"model.layers.{i}.", f"layers.{i}."
        attn, mlp = hf_prefix + "self_attn.", hf_prefix + "mlp."
        state[prefix + "attn_norm.weight"] = take(hf_prefix + "input_layernorm.weight")
        state[prefix + "ffn_norm.weight"] = take(hf_prefix + "post_attention_layernorm.weight")
        state[prefix + "attn.wqkv.weight"] = torch.cat([take(attn + p + "_proj.weight") for p in "qkv"])
        state[prefix + "attn.wo.weight"] = take(attn + "o_proj.weight")
        state[prefix + "ffn.w_gate_up.weight"] = torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")])
        state[prefix + "ffn.w_down.weight"] = take(mlp + "down_proj.weight")
        if config.qkv_bias:
            state[prefix + "attn.wqkv.bias"] = torch.cat([take(attn + p + "_proj.bias") for p in "qkv"])
        if config.o_bias:
            state[prefix + "attn.wo.bias"] = take(attn + "o_proj.bias")
        if config.mlp_bias:
            state[prefix + "ffn.w_gate_up.bias"] = torch.cat([take(mlp + "gate_proj.bias"), take(mlp + "up_proj.bias")])
            state[prefix + "ffn.w_down.bias"] = take(mlp + "down_proj.bias")
        if config.qk_norm:
            state[prefix + "attn.q_norm.weight"] = take(attn + "q_norm.weight")
            state[prefix + "attn.k_norm.weight"] = take(attn + "k_norm.weight")
    return state


def load_model(
    folder: str | Path, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> Transformer:
    """Build the model for `folder` and fill it with its weights, cast to `dtype` and moved to `device`."""
    folder = Path(folder)
    config = ModelConfig.from_dir(folder)
    dtype, device = parse_dtype(dtype), torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError("device 'cuda' requested but torch sees no CUDA GPU; use --device cpu")
    mapped = load_hf_tensors(folder)
    state = to_edge_names(mapped.tensors, config)
    _check_shapes(state, config)
    state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in state.items()}
    mapped.release_unless_used(list(state.values()))
    with torch.device("meta"):
        model = Transformer(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.inv_freq = inverse_frequencies(config).to(device)  # the meta-device buffer held no data
    return model.eval().requires_grad_(False)


def _check_shapes(state: dict[str, torch.Tensor], config: ModelConfig) -> None:
    with torch.device("meta"):
        expected = Transformer(config).state_dict()
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"tensor {name} has shape {tuple(tensor.shape)} but config.json implies "
                f"{tuple(expected[name].shape)}; the weights and config.json do not belong together"
            )
