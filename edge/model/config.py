"""ModelConfig: one dataclass for the decoder families edge runs, built from a Hugging Face `config.json`.

Each supported architecture has one small entry in `ARCHITECTURES` that reads its own keys (qkv bias, q/k norm,
sliding window, Gemma's sandwich norms and local layers, Phi-3's partial rotary...) on top of the fields every family
shares. Adding a family means adding one function here and,
if its weights are named differently, one entry in `edge/sources/checkpoint_names.py`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from edge.errors import CheckpointError, UnsupportedModelError
from edge.files import FileRefused, read_regular, special_kind
from edge.memory.footprint import ModelShape

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # the feed-forward gate's activation (SwiGLU, GeGLU)
MAX_CONFIG_BYTES = 16 * 2**20  # a config.json is a few KiB (Phi-3's LongRoPE factors: tens)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # bias on the q, k and v projections (Qwen2, Llama attention_bias)
    o_bias: bool = False  # bias on the output projection (Llama attention_bias)
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    sliding_window: int | None = None  # a windowed layer attends to at most this many positions (Mistral, Gemma 3)
    local_layers: tuple[bool, ...] | None = None  # per layer, whether it is windowed (Gemma 3); None: all are
    local_rope_theta: float | None = None  # the rope base of the windowed layers, unscaled (Gemma 3); None: rope_theta
    rotary_dim: int | None = None  # leading dims of each head that rotate (Phi-4-mini's partial rotary); None: head_dim
    activation: str = "silu"  # the gate's activation: silu (SwiGLU) or gelu_pytorch_tanh (Gemma's GeGLU)
    sandwich_norms: bool = False  # RMSNorm on the attention's and feed-forward's outputs too (Gemma 2/3)
    norm_shift: float = 0.0  # the checkpoint's norm weights w scale by (shift + w) (Gemma: 1); the model holds the sum
    embedding_scale: float | None = None  # the embedding is multiplied by this (Gemma: sqrt(hidden_size))
    attention_scale: float | None = None  # the scores' scale (Gemma: query_pre_attn_scalar ** -0.5); None: Dh ** -0.5
    final_logit_softcapping: float | None = None  # logits = c * tanh(logits / c) (Gemma 2)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    source_dtype: str | None = None  # dtype the checkpoint was saved in

    q_size = ModelShape.q_size  # num_heads * head_dim, read from this config's fields of the same names
    kv_size = ModelShape.kv_size  # num_kv_heads * head_dim

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer` (None: it attends to every position before it)."""
        return self.sliding_window if self.local_layers is None or self.local_layers[layer] else None

    def local_rope(self, layer: int) -> bool:
        """Whether `layer` rotates with the local rope base (local_rope_theta) rather than the global one."""
        return self.local_rope_theta is not None and self.local_layers is not None and self.local_layers[layer]

    @property
    def local_rope_layers(self) -> bool:
        """Whether some layer rotates with the local rope base (then the model keeps a second rope table)."""
        return any(self.local_rope(layer) for layer in range(self.num_layers))

    @property
    def llama_layout(self) -> bool:
        """Whether every layer has the Llama family's layout: pre-norm attention and SwiGLU, one rope for all layers
        over the whole head, the default scales. That is what edge's own ONNX graphs (edge/export) and the GPU's static
        step (static_step.py) compute; other families (Gemma 3, Phi-3) export through optimum and take the GPU's eager
        passes. The CPU kernel's fused calls run every family (edge/model/kernel_glue.py)."""
        return (self.local_rope_theta is None and self.rotary_dim in (None, self.head_dim)
                and self.activation == "silu" and not self.sandwich_norms and self.embedding_scale is None
                and self.attention_scale is None and self.final_logit_softcapping is None
                and (self.rope_scaling or {}).get("rope_type") != "longrope")

    def shape(self) -> ModelShape:
        """The model's sizes as one plain record (edge.memory.footprint.ModelShape, each of its fields read from this
        config's field of the same name): what the memory planner counts bytes from and the CPU kernel's fused calls
        read."""
        return ModelShape(**{f.name: getattr(self, f.name) for f in fields(ModelShape)})

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        return cls.from_hf(read_config_json(path), source=str(Path(path) / "config.json"))

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        architecture = _architecture_of(raw)
        if architecture in TEXT_MODELS:  # a multimodal checkpoint: its text model
            architecture, raw = _text_model(raw, architecture)
        reader = ARCHITECTURES.get(architecture)
        if reader is None:
            supported = ", ".join(sorted([*ARCHITECTURES, *TEXT_MODELS]))
            raise UnsupportedModelError(
                f"unsupported architecture {architecture!r} in {source}; edge supports: {supported}"
            )
        try:
            fields = _common_fields(raw)
            fields.update(reader(raw))
        except KeyError as exc:
            raise CheckpointError(f"{source} lacks the key {exc.args[0]!r} that {architecture} needs") from None
        except _BadSize as exc:
            key, value = exc.args
            raise CheckpointError(f"{source}: {key} must be a positive whole number, got {value!r}; fix the file, or "
                                  "download the checkpoint's config.json again") from None
        config = cls(architecture=architecture, **fields)
        _check(config, source)
        return config


def _architecture_of(raw: dict[str, Any]) -> str:
    architectures = raw.get("architectures") or []
    if architectures:
        return architectures[0]
    by_model_type = {reader_model_type: name for name, reader_model_type in _MODEL_TYPES.items()}
    model_type = raw.get("model_type", "<missing>")
    return by_model_type.get(model_type, model_type)


class _BadSize(ValueError):
    """(key, value): a size in config.json that is not a positive whole number."""


def _size(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    """raw[key] (or `default` where it is missing or null), checked to be a positive whole number."""
    value = raw[key] if default is None else (raw.get(key) or default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _BadSize(key, value)
    return value


def _common_fields(raw: dict[str, Any]) -> dict[str, Any]:
    num_heads = _size(raw, "num_attention_heads")
    hidden_size = _size(raw, "hidden_size")
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return dict(
        vocab_size=_size(raw, "vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=_size(raw, "intermediate_size"),
        num_layers=_size(raw, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=_size(raw, "num_key_value_heads", num_heads),
        head_dim=_size(raw, "head_dim", hidden_size // num_heads),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=raw.get("rope_theta", 10000.0),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        rope_scaling=_rope_scaling(raw.get("rope_scaling")),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
        source_dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


def _rope_scaling(scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    if not scaling:
        return None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"unsupported rope_scaling type {rope_type!r}; edge supports: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return {**scaling, "rope_type": rope_type}


def _read_llama(raw: dict[str, Any]) -> dict[str, Any]:
    attention_bias = raw.get("attention_bias", False)
    return dict(qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=raw.get("mlp_bias", False))


def _read_mistral(raw: dict[str, Any]) -> dict[str, Any]:
    return dict(sliding_window=raw.get("sliding_window"))


def _refuse_qwen_sliding_window(raw: dict[str, Any]) -> None:
    if raw.get("use_sliding_window"):
        raise UnsupportedModelError(
            "use_sliding_window=true (per-layer sliding windows) is not supported; set it to false in config.json"
        )


def _read_qwen2(raw: dict[str, Any]) -> dict[str, Any]:
    _refuse_qwen_sliding_window(raw)
    return dict(qkv_bias=True)


def _read_qwen3(raw: dict[str, Any]) -> dict[str, Any]:
    _refuse_qwen_sliding_window(raw)
    attention_bias = raw.get("attention_bias", False)
    return dict(qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True)


def _read_gemma3(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3 text: windowed local layers (every sliding_window_pattern-th layer global, or `layer_types`) with their
    own rope base, q/k norms, GeGLU, norms before and after each block, norms stored as (1 + w), scaled embedding."""
    if raw.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError("attn_logit_softcapping (Gemma 2's capped attention scores) is not supported")
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention (an embedding model, EmbeddingGemma) does not "
                                    "generate text; edge runs Gemma 3's causal models")
    layers = _size(raw, "num_hidden_layers")
    types = raw.get("layer_types")
    if types is None:
        pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise CheckpointError(f"layer_types must name sliding_attention or full_attention for each of the {layers} "
                              "layers")
    activation = raw.get("hidden_activation") or "gelu_pytorch_tanh"
    if activation not in ACTIVATIONS:
        raise UnsupportedModelError(f"hidden_activation {activation!r} is not supported; edge runs "
                                    f"{', '.join(ACTIVATIONS)}")
    return dict(
        qk_norm=True, qkv_bias=raw.get("attention_bias", False), o_bias=raw.get("attention_bias", False),
        sliding_window=raw.get("sliding_window"), local_layers=tuple(kind == "sliding_attention" for kind in types),
        local_rope_theta=float(raw.get("rope_local_base_freq", 10000.0)), activation=activation,
        sandwich_norms=True, norm_shift=1.0, embedding_scale=math.sqrt(_size(raw, "hidden_size")),
        attention_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        final_logit_softcapping=raw.get("final_logit_softcapping"),
        rope_theta=raw.get("rope_theta", 1_000_000.0), tie_word_embeddings=raw.get("tie_word_embeddings", True),
    )


def _read_phi3(raw: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 / Phi-3.5 / Phi-4-mini: fused qkv and gate_up projections (loading.py), partial rotary, LongRoPE."""
    head_dim = _size(raw, "head_dim", _size(raw, "hidden_size") // _size(raw, "num_attention_heads"))
    rotary_dim = int(head_dim * raw.get("partial_rotary_factor", 1.0))
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise CheckpointError(f"partial_rotary_factor {raw.get('partial_rotary_factor')} does not give an even "
                              f"number of rotary dims of the head's {head_dim}")
    if raw.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {raw.get('hidden_act')!r} is not supported for Phi-3; edge runs silu")
    attention_bias = raw.get("attention_bias", False)
    fields = dict(qkv_bias=attention_bias, o_bias=attention_bias, sliding_window=raw.get("sliding_window"),
                  rotary_dim=rotary_dim)
    scaling = _rope_scaling(raw.get("rope_scaling"))
    if scaling is not None and scaling["rope_type"] == "longrope":
        original = scaling.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings")
        fields["rope_scaling"] = {**scaling, "original_max_position_embeddings": original,
                                  "max_position_embeddings": raw.get("max_position_embeddings", original)}
    return fields


# architecture name in config.json -> reader of its family-specific keys
ARCHITECTURES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "LlamaForCausalLM": _read_llama,  # Llama 2/3.x, TinyLlama, SmolLM/SmolLM2
    "MistralForCausalLM": _read_mistral,
    "Qwen2ForCausalLM": _read_qwen2,  # Qwen2, Qwen2.5
    "Qwen3ForCausalLM": _read_qwen3,
    "Gemma3ForCausalLM": _read_gemma3,  # Gemma 3 text (270M, 1B; 4B and up: TEXT_MODELS below)
    "Phi3ForCausalLM": _read_phi3,  # Phi-3, Phi-3.5-mini, Phi-4-mini
}
_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
}


# multimodal checkpoints whose text model edge runs: architecture -> the text model's architecture, and what its
# text_config may leave out (transformers' defaults, Gemma3TextConfig's, on which the Hub's config.json files rely)
TEXT_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "Gemma3ForConditionalGeneration": ("Gemma3ForCausalLM", dict(  # Gemma 3 4B, 12B, 27B
        vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=256,
        sliding_window=4096, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1)),
}
_CARRIED = ("bos_token_id", "eos_token_id", "tie_word_embeddings", "torch_dtype", "dtype")  # top-level keys that apply


def _text_model(raw: dict[str, Any], architecture: str) -> tuple[str, dict[str, Any]]:
    """A multimodal config.json's text model: its architecture and config (text_config over the defaults, with the
    top-level ids and dtype where text_config gives none). The weights are read under their text-model names
    (edge/sources/checkpoint_names.py TEXT_MODEL_PREFIXES); the vision tower is left in the file."""
    text_architecture, defaults = TEXT_MODELS[architecture]
    text = raw.get("text_config") or {}
    carried = {key: raw[key] for key in _CARRIED if raw.get(key) is not None}
    return text_architecture, {**defaults, **carried, **text, "architectures": [text_architecture]}


def _check(config: ModelConfig, source: str) -> None:
    if config.num_heads % config.num_kv_heads:
        raise CheckpointError(
            f"{source}: num_attention_heads={config.num_heads} is not a multiple of "
            f"num_key_value_heads={config.num_kv_heads}; the config is inconsistent"
        )
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
        if getattr(config, name) <= 0:
            raise CheckpointError(f"{source}: {name} must be positive, got {getattr(config, name)}")
    if not math.isfinite(config.rope_theta) or config.rope_theta <= 0:
        raise CheckpointError(f"{source}: rope_theta must be a positive number, got {config.rope_theta}")
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") == "longrope":
        rotary = config.rotary_dim or config.head_dim
        if not scaling.get("original_max_position_embeddings") or any(
                len(scaling.get(name) or ()) != rotary // 2 for name in ("short_factor", "long_factor")):
            raise CheckpointError(f"{source}: a longrope rope_scaling needs original_max_position_embeddings and "
                                  f"{rotary // 2} short and long factors (one per rotary frequency)")


def read_config_json(folder: str | Path) -> dict[str, Any]:
    """A checkpoint folder's config.json as a JSON object, or one CheckpointError naming what is wrong with it."""
    config_path = Path(folder) / "config.json"
    fix = "fix the file, or download the checkpoint's config.json again"
    kind = special_kind(config_path)
    if kind is not None:  # a pipe or a device under its name: never read
        raise CheckpointError(f"{config_path} is {kind}, not a config file; {fix}")
    if not config_path.is_file():
        raise CheckpointError(
            f"{config_path} not found: a checkpoint folder needs the Hugging Face config.json next to its weights"
        )
    try:
        raw = json.loads(read_regular(config_path, MAX_CONFIG_BYTES).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise CheckpointError(f"{config_path} is not valid JSON ({reason}); {fix}") from None
    except FileRefused as exc:
        raise CheckpointError(f"{config_path} is {exc.reason}, not a config file; {fix}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {config_path}: {exc.strerror or exc}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_path} does not hold a JSON object; {fix}")
    return raw

