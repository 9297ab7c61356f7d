"""Load a Hugging Face checkpoint folder into `Transformer`: safetensors only, memory-mapped, never unpickled.

Model files are untrusted input. Every safetensors header is parsed and checked here (dtype known, shape matches
the byte range, the range lies inside the file) before a tensor is viewed; pickled `.bin`/`.pt` files are refused.
Tensors whose dtype already matches are zero-copy views of a copy-on-write memory map; the q/k/v and gate/up
projections are concatenated once into the fused weights the model uses.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from pathlib import Path

import torch

from edge.model.config import ModelConfig, read_config_json
from edge.model.finite import nonfinite_tensor
from edge.errors import CheckpointError, SettingError
from edge.files import special_kind
from edge.sources.checkpoint_names import TEXT_MODEL_PREFIXES, layer_names
from edge.sources.gguf_checkpoint import gguf_index
from edge.model.kernel_glue import use_kernel
from edge.model.transformer import Transformer
from edge.model.rope import inverse_frequencies
from edge.kernels.cpu_kernel import CpuKernel
from edge.kernels.cpu_paths import KernelPathError

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


def not_a_folder(path: Path) -> str:
    """The one-line reason a model path that is not a folder cannot be loaded."""
    kind = special_kind(path)
    if kind is not None:
        return f"{path} is {kind}, not a model; pass the checkpoint folder holding config.json (or a .gguf file)"
    if path.is_file():
        return f"{path} is a file, not a checkpoint folder; pass the folder holding config.json (or a .gguf file)"
    return f"checkpoint folder {path} does not exist; pass the folder holding config.json"


def _regular(path: Path) -> bool:
    """True for a regular file (or a symlink to one); a device, pipe or socket under a weight file's name is a
    CheckpointError saying what it is."""
    kind = special_kind(path)
    if kind is not None:
        raise CheckpointError(f"{path} is {kind}, not a regular file; put the weights file there")
    return path.is_file()


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (one file, or the shards its index names)."""
    if not folder.is_dir():
        raise CheckpointError(not_a_folder(folder))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
            raise CheckpointError(f"{index} is not a valid safetensors index (no weight_map); re-save the checkpoint")
        shards = sorted(set(weight_map.values()))
        missing = [name for name in shards if not _regular(folder / name)]
        if missing:
            raise CheckpointError(f"shard {folder / missing[0]} named by {index.name} is missing; download it again")
        return [folder / name for name in shards]
    single = folder / "model.safetensors"
    if _regular(single):
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

    def rename(self, prefixes: dict[str, str]) -> None:
        """Name each tensor whose name starts with one of `prefixes` with that prefix replaced by its value."""
        def renamed(name: str) -> str:
            old = next((prefix for prefix in prefixes if name.startswith(prefix)), None)
            return name if old is None else prefixes[old] + name[len(old):]

        self.tensors = {renamed(name): tensor for name, tensor in self.tensors.items()}
        self._spans = {renamed(name): span for name, span in self._spans.items()}

    def release(self, name: str) -> None:
        """Drop the resident pages of a mapped tensor that has been copied (fused or converted).

        Without this, the pages read while copying would stay in the process's resident memory next to the copy.
        Only whole pages inside the tensor's span are released; the tensor must not be read afterwards."""
        if name not in self._spans:
            return
        buffer, start, end = self._spans.pop(name)
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, end // page * page
        if last > first:
            buffer.madvise(mmap.MADV_DONTNEED, first, last - first)


def read_safetensors(path: Path, into: MappedTensors) -> None:
    """Add every tensor of one file to `into`, as views of a copy-on-write memory map."""
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            header_len, header = _read_header(handle, path, size)
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


def _read_header(handle, path: Path, size: int) -> tuple[int, dict]:
    if size < 8:
        raise CheckpointError(f"{path} is truncated ({size} bytes); download it again")
    (header_len,) = struct.unpack("<Q", handle.read(8))
    if header_len > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"{path} is truncated or not a safetensors file (bad header length); download it again")
    return header_len, _parse_header(handle.read(header_len), path)


def header_of(path: Path) -> dict:
    """One safetensors file's parsed header (no tensor data read)."""
    try:
        with path.open("rb") as handle:
            return _read_header(handle, path, path.stat().st_size)[1]
    except OSError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None


def checkpoint_dtype(folder: str | Path, config: ModelConfig | None = None) -> torch.dtype | None:
    """The floating dtype of a checkpoint's tensors (None if they mix several), from its first weight file's header
    (no data read); without weight files (planning from config.json alone), the dtype config.json names (`config`:
    the folder's config, when it has been read already)."""
    folder = Path(folder)
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.safetensors.index.json")):
        if config is not None:
            return DTYPES.get(str(config.source_dtype))
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            return None
        return DTYPES.get(str(config.get("torch_dtype") or config.get("dtype"))) if isinstance(config, dict) else None
    header = header_of(weight_files(folder)[0])
    kinds = {SAFETENSORS_DTYPES.get(info.get("dtype")) for name, info in header.items()
             if name != "__metadata__" and isinstance(info, dict)}
    return _single_float_dtype(kinds)


def _single_float_dtype(dtypes: set) -> torch.dtype | None:
    """The one floating dtype a checkpoint's tensors share, or None when they mix several (then nothing is kept
    narrow: a float32 tensor stored as float16 would lose bits)."""
    floats = {dtype for dtype in dtypes if dtype is not None and dtype.is_floating_point}
    return floats.pop() if len(floats) == 1 else None


def storage_dtype(source: torch.dtype | None, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype weights are kept in: a 16-bit checkpoint computed in float32 on the CPU keeps its own precision
    (the batch-invariant kernel widens it in registers, exactly: the same results, half the memory, and faster
    because decoding is bound by weight reads); anything else is stored in the compute dtype."""
    if dtype == torch.float32 and device.type == "cpu" and source in (torch.float16, torch.bfloat16):
        if cpu_kernel() is not None:  # without it every call would widen a copy of each matrix
            return source
    return dtype


def cpu_kernel():
    """edge's batch-invariant CPU kernel on this CPU's path (or EDGE_CPU_KERNEL's), or None where it cannot be
    built (edge/kernels/cpu_kernel.py)."""
    try:
        return CpuKernel.load()
    except KernelPathError as error:
        raise SettingError(str(error)) from None


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


def weight_recipe(config: ModelConfig) -> dict[str, list[str]]:
    """For each of the model's tensors, the Hugging Face tensors it is made of (several are concatenated)."""
    recipe = {"embed.weight": ["model.embed_tokens.weight"], "norm.weight": ["model.norm.weight"]}
    if not config.tie_word_embeddings:
        recipe["lm_head.weight"] = ["lm_head.weight"]
    names = layer_names(config)
    biased = {"attn.wqkv": config.qkv_bias, "attn.wo": config.o_bias, "ffn.w_gate_up": config.mlp_bias,
              "ffn.w_down": config.mlp_bias}
    wanted = ["attn_norm", "attn.wqkv", "attn.wo", "ffn_norm", "ffn.w_gate_up", "ffn.w_down"]
    wanted += ["attn.q_norm", "attn.k_norm"] if config.qk_norm else []
    wanted += ["post_attn_norm", "post_ffn_norm"] if config.sandwich_norms else []
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for part in wanted:
            recipe[f"{ours}{part}.weight"] = [f"{hf}{name}.weight" for name in names[part]]
            if biased.get(part):
                recipe[f"{ours}{part}.bias"] = [f"{hf}{name}.bias" for name in names[part]]
    return recipe


def _source_shapes(config: ModelConfig, name: str, fused: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    """The shape config.json implies for each of the `count` checkpoint tensors that `weight_recipe` fuses into the
    model's `name` (whose shape is `fused`): q, k and v rows, gate and up rows, or the one tensor itself (also a
    projection the checkpoint stores fused)."""
    if count == 1:
        return [fused]
    if ".attn.wqkv." in name:
        rows = [config.q_size, config.kv_size, config.kv_size]
    else:
        rows = [config.intermediate_size, config.intermediate_size]
    return [(rows_, *fused[1:]) for rows_ in rows]


def build_state(
    mapped, config: ModelConfig, dtype: torch.dtype, device: torch.device,
    bias_dtype: torch.dtype | None = None, norm_shift: float = 0.0,
) -> dict[str, torch.Tensor]:
    """The model's state dict from mapped checkpoint tensors (MappedTensors, or a GGUF file's tensors:
    edge.sources.gguf_weights.FloatTensors), one tensor at a time, in `dtype` (biases in
    `bias_dtype` when given: the compute dtype, when the weights are stored narrower). `norm_shift` is added to every
    norm weight (Gemma's checkpoints store w for a norm that scales by 1 + w; the model holds the sum, computed in
    float32 as transformers does, and kept in the compute dtype).

    A tensor that is already in the right dtype and device stays a view of the map. One that is fused or converted
    becomes a copy, and the pages of its sources are released right away, so peak memory stays near one copy of
    the weights."""
    recipe = weight_recipe(config)
    missing = next((name for sources in recipe.values() for name in sources if name not in mapped.tensors), None)
    if missing is not None:
        raise CheckpointError(f"checkpoint lacks tensor {missing!r} that {config.architecture} needs; is it complete?")
    expected = Transformer(config, device="meta").state_dict()  # shapes only, no memory
    state = {}
    for name, sources in recipe.items():
        parts = [mapped.tensors[source] for source in sources]
        for source, part, shape in zip(sources, parts,
                                       _source_shapes(config, name, tuple(expected[name].shape), len(sources))):
            if tuple(part.shape) != shape:  # named as the checkpoint names it, not by edge's fused name
                raise CheckpointError(
                    f"checkpoint tensor {source!r} has shape {tuple(part.shape)} but config.json implies {shape}; "
                    "the weights and config.json are from different models: use the config.json that came with "
                    "these weights"
                )
        shifted = norm_shift and name.endswith("norm.weight")
        wanted = bias_dtype if bias_dtype is not None and (name.endswith(".bias") or shifted) else dtype
        tensor = torch.cat(parts) if len(parts) > 1 else parts[0]
        if shifted:
            tensor = norm_shift + tensor.float()
        tensor = tensor.to(device=device, dtype=wanted)
        for source, part in zip(sources, parts):
            if tensor.untyped_storage().data_ptr() != part.untyped_storage().data_ptr():
                mapped.release(source)
        state[name] = tensor
    return state


def read_config(folder: str | Path) -> tuple[ModelConfig, dict]:
    """A checkpoint's config.json, read once: its ModelConfig and the JSON object itself (for what else reads it,
    such as the tokenizer's bos and eos token ids), with ModelConfig.from_dir's checks and messages."""
    raw = read_config_json(folder)
    return ModelConfig.from_hf(raw, source=str(Path(folder) / "config.json")), raw


def check_checkpoint(folder: str | Path, config: ModelConfig | None = None) -> ModelConfig:
    """The checkpoint's config, after checking what a load reads first, in order: config.json (unless `config`, read
    from it already, is given), then that the weight files are there (their headers are read by load_model; a
    folder read from a GGUF file names the file). The tokenizer comes after these, so an empty or broken folder is
    reported by its first problem."""
    config = config if config is not None else ModelConfig.from_dir(folder)
    if gguf_index(folder) is None:
        _check_layer_count(Path(folder), config, weight_files(Path(folder)))
    return config


LAYER_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _check_layer_count(folder: Path, config: ModelConfig, files: list[Path]) -> None:
    """config.json's layer count against the layers the weights' headers name: a damaged count (a billion layers)
    would have the load build names, shapes and modules for each before any weight was missed."""
    names = [name for path in files for name in header_of(path)]
    layers = {int(found[1]) for name in names if (found := LAYER_NAME.search(name))}
    if layers and config.num_layers > len(layers):
        raise CheckpointError(f"{folder / 'config.json'} says num_hidden_layers {config.num_layers:,}, but the weights "
                              f"hold {len(layers):,} layers; fix the file, or download the checkpoint's config.json "
                              "again")


def load_model(
    folder: str | Path, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
    dequantize: bool = False, config: ModelConfig | None = None,
    substitutes: dict[str, torch.Tensor] | None = None,
) -> Transformer:
    """Build the model for `folder` and fill it with its weights, computing in `dtype` on `device`. A float16 or
    bfloat16 checkpoint computed in float32 on the CPU keeps its weights in their own precision (storage_dtype). A
    folder read from a quantized GGUF file keeps the file's quantization on the CPU (edge/sources/gguf_weights.py),
    unless `dequantize` asks for 16-bit weights. `config` is the folder's, when it has been read already.
    `substitutes` stand in for tensors a safetensors folder leaves out (a packed feature drafter's embedding, which is
    its target's)."""
    folder = Path(folder)
    config = config if config is not None else ModelConfig.from_dir(folder)
    dtype, device = parse_dtype(dtype), torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError("device 'cuda' requested but torch sees no CUDA GPU; use --device cpu")
    index = gguf_index(folder)
    if index is not None:
        from edge.sources import gguf_weights

        kernel = cpu_kernel() if device.type == "cpu" and dtype == torch.float32 else None
        if gguf_weights.runs_as_blocks(index) and not dequantize and kernel is not None:
            return check_finite(gguf_weights.block_model(folder, index, kernel, config), folder, index)
        mapped = gguf_weights.float_tensors(folder, index, config)
        source = mapped.source_dtype
    else:
        mapped = load_hf_tensors(folder)
        mapped.rename(TEXT_MODEL_PREFIXES)  # a multimodal checkpoint's text model (its vision tower is not read)
        mapped.tensors.update(substitutes or {})
        source = _single_float_dtype({tensor.dtype for tensor in mapped.tensors.values()})
    storage = storage_dtype(source, dtype, device)
    # a GGUF file's norms hold the shifted weights already (llama.cpp's converter adds Gemma's 1)
    state = build_state(mapped, config, storage, device, bias_dtype=dtype if storage != dtype else None,
                        norm_shift=config.norm_shift if index is None else 0.0)
    # not `with torch.device("meta")`: that context imports torch._dynamo and sympy (about 70 MiB resident)
    model = Transformer(config, device="meta")
    model.load_state_dict(state, strict=True, assign=True)
    model.inv_freq = inverse_frequencies(config).to(device)  # the meta-device buffers held no data
    if config.local_rope_layers:
        model.inv_freq_local = inverse_frequencies(config, local=True).to(device)
    if storage != dtype:
        model.compute_dtype = dtype  # 16-bit weights, float32 activations and KV cache (see storage_dtype)
    if device.type == "cpu" and dtype == torch.float32:
        use_kernel(model, cpu_kernel())  # exact speculation: verify rows == decode rows, bit for bit
    return check_finite(model.eval().requires_grad_(False), folder, index)


def check_finite(model: Transformer, folder: Path, index: dict | None) -> Transformer:
    """`model`, once its norms, biases and a sample of its embedding are seen to hold no NaN or Inf
    (edge/model/finite.py); else a CheckpointError naming the tensor as the file names it."""
    found = nonfinite_tensor(model)
    if found is None:
        return model
    name, holds = found
    source = index["file"] if index is not None else folder  # a folder read from a GGUF file: the file
    raise CheckpointError(f"{source}: tensor {checkpoint_tensor_name(model.config, name, index)} holds {holds}; "
                          "the weights are damaged: download the model again (or re-convert it)")


def checkpoint_tensor_name(config: ModelConfig, name: str, index: dict | None) -> str:
    """The name the checkpoint file gives edge's tensor `name` (its first part, for a fused one): the safetensors
    name, or the GGUF name for a folder read from a GGUF file; `name` itself when none is known."""
    sources = weight_recipe(config).get(name, [name])
    if index is not None:
        by_name = {entry["name"]: entry["gguf"] for entry in index.get("tensors", [])}
        return by_name.get(sources[0], sources[0])
    return sources[0]
