"""Small GGUF files written from a Hugging Face checkpoint folder the way llama.cpp's convert_hf_to_gguf.py writes
them (the metadata keys, the q/k row permutation of Llama layers, Llama 3's rope_freqs, Gemma 3's norms stored as
1 + w and its own tensor names, Phi-3's fused tensors, rotary dims and LongRoPE factors, the byte-level BPE
vocabulary), in any of the types edge runs, and the reference those files should load as: the same checkpoint
holding the values the file holds.

The gguf package quantizes the 32-weight types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1); `quantize_k` here writes the k-quants
(Q4_K, Q5_K, Q6_K) in llama.cpp's byte layout with a plain scale choice (the maximum per sub-block; llama.cpp
searches for better ones). Either way the gguf package's dequantization says what a file's bytes stand for.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType, TokenType, quants
from safetensors.torch import load_file, save_file

QTYPES = {name: GGMLQuantizationType[name.upper()] for name in
          ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")}
K_QUANTS = ("q4_k", "q5_k", "q6_k")
# llama.cpp's general.file_type of a file whose matrices are all of one type (q4_k: Q4_K_S, q5_k: Q5_K_S)
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q4_k": 14, "q5_k": 16,
              "q6_k": 18, "bf16": 32}
# a Q4_K_M-like mixture: llama.cpp's default for that file type keeps v, the down projections and the head in Q6_K
Q4_K_M = {"default": "q4_k", "attn_v": "q6_k", "ffn_down": "q6_k", "output": "q6_k", "token_embd": "q4_k"}
ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
         "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3"}
NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         # Gemma 3 (gguf's MODEL_TENSORS[GEMMA3]): its post_attention_layernorm normalizes the attention's output
         "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
         # Phi-3: fused as the checkpoint stores them; ffn_up holds gate and up
         "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
ARCH_NAMES = {"gemma3": {**NAMES, "post_attention_layernorm": "post_attention_norm"}}


def gguf_name(name: str, arch: str = "llama") -> str:
    if name.startswith("model.layers."):
        layer, rest = name.removeprefix("model.layers.").split(".", 1)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{ARCH_NAMES.get(arch, NAMES)[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py): each head's rows (2, D/2) -> (D/2, 2)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


def _safe_inverse(values: np.ndarray) -> np.ndarray:
    return np.where(values > 0, 1.0 / np.where(values > 0, values, 1.0), 0.0)


def quantize_k(values: np.ndarray, qtype: str) -> np.ndarray:
    """(rows, K) float32 -> a k-quant's bytes (rows, K / 256 * block bytes), K a multiple of 256."""
    rows, columns = values.shape
    x = values.reshape(-1, 256).astype(np.float32)  # (blocks, 256)
    if qtype == "q6_k":
        runs = x.reshape(-1, 16, 16)
        scales = np.abs(runs).max(axis=2) / 31.0  # (blocks, 16)
        d = _f16(scales.max(axis=1) / 127.0)  # (blocks,)
        sc = np.clip(np.round(scales * _safe_inverse(d)[:, None]), -128, 127).astype(np.int8)  # (blocks, 16)
        step = d[:, None] * sc.astype(np.float32)
        q = np.clip(np.round(runs * _safe_inverse(step)[..., None]) + 32, 0, 63).astype(np.uint8).reshape(-1, 256)
        half = q.reshape(-1, 2, 4, 32)  # (blocks, half, quarter, l): element 128 h + 32 t + l
        ql = np.concatenate([(half[:, :, 0] & 15) | ((half[:, :, 2] & 15) << 4),
                             (half[:, :, 1] & 15) | ((half[:, :, 3] & 15) << 4)], axis=2).reshape(-1, 128)
        qh = ((half[:, :, 0] >> 4) | ((half[:, :, 1] >> 4) << 2) | ((half[:, :, 2] >> 4) << 4)
              | ((half[:, :, 3] >> 4) << 6)).reshape(-1, 64)
        blocks = np.concatenate([ql, qh, sc.view(np.uint8), d.astype(np.float16).view(np.uint8).reshape(-1, 2)], axis=1)
        return blocks.reshape(rows, -1)
    levels = 15 if qtype == "q4_k" else 31
    runs = x.reshape(-1, 8, 32)
    low = np.minimum(runs.min(axis=2), 0.0)  # (blocks, 8)
    scales, mins = (runs.max(axis=2) - low) / levels, -low
    d, dmin = _f16(scales.max(axis=1) / 63.0), _f16(mins.max(axis=1) / 63.0)  # (blocks,)
    sc = np.clip(np.round(scales * _safe_inverse(d)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(mins * _safe_inverse(dmin)[:, None]), 0, 63).astype(np.uint8)
    step, offset = d[:, None] * sc, dmin[:, None] * m  # (blocks, 8)
    q = np.clip(np.round((runs + offset[..., None]) * _safe_inverse(step)[..., None]), 0, levels).astype(np.uint8)
    q = q.reshape(-1, 4, 2, 32)  # (blocks, pair of sub-blocks, which, l)
    qs = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
    packed_scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6),
                                    (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=1)  # (blocks, 12)
    parts = [d.astype(np.float16).view(np.uint8).reshape(-1, 2), dmin.astype(np.float16).view(np.uint8).reshape(-1, 2),
             packed_scales]
    if qtype == "q5_k":
        high = (q >> 4).reshape(-1, 8, 32)  # (blocks, sub-block j, l): bit j of qh[l]
        parts.append(np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[None, :, None], axis=1))
    parts.append(qs)
    return np.concatenate(parts, axis=1).reshape(rows, -1)


def quantized(values: np.ndarray, qtype: str) -> np.ndarray:
    """A tensor's bytes in a GGUF of this type (1-D tensors stay float32, as in llama.cpp)."""
    if values.ndim == 2 and qtype in K_QUANTS:
        return quantize_k(values, qtype)
    return quants.quantize(values, GGMLQuantizationType[qtype.upper()] if values.ndim == 2 else GGMLQuantizationType.F32)


def tensor_type(name: str, qtype: str | dict) -> str:
    """The type a tensor takes in a file of `qtype` (a type, or a mixture: {tensor kind or "default": type})."""
    if isinstance(qtype, str):
        return qtype
    kind = name.removesuffix(".weight").removesuffix(".bias").split(".")[-1]
    return qtype.get(kind, qtype["default"])


def held_values(values: np.ndarray, qtype: str) -> np.ndarray:
    """What a GGUF of this type holds for a tensor, as float32 (1-D tensors stay float32, as in llama.cpp)."""
    kind = GGMLQuantizationType[qtype.upper()] if values.ndim == 2 else GGMLQuantizationType.F32
    return quants.dequantize(quantized(values, qtype), kind).astype(np.float32)


def write_gguf(folder: Path, out: Path, qtype: str | dict = "f32", *, pre: str = "gpt-2", metadata: dict | None = None,
               keep=None) -> Path:
    """`folder`'s checkpoint as a GGUF file of `qtype`: one type for every matrix, or a mixture (Q4_K_M above).
    Damaged files for tests: `metadata` replaces {arch}.* numbers (head_count: 0), `keep(gguf name, values)` returns
    the values to write (fewer rows, ...) or None to leave the tensor out."""
    config = json.loads((folder / "config.json").read_text())
    arch = ARCHS[config["architectures"][0]]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = GGUFWriter(out, arch)
    writer.add_name(folder.name)
    writer.add_uint32("general.file_type", FILE_TYPES[qtype] if isinstance(qtype, str) else 15 if qtype == Q4_K_M
                      else FILE_TYPES[qtype["default"]])  # 15: Q4_K_M
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    numbers = {"attention.head_count": heads, "attention.head_count_kv": kv_heads, **(metadata or {})}
    writer.add_uint32(f"{arch}.attention.head_count", numbers["attention.head_count"])
    writer.add_uint32(f"{arch}.attention.head_count_kv", numbers["attention.head_count_kv"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    extra_tensors = _FAMILY_KEYS.get(arch, lambda writer, config: {})(writer, config)
    _add_vocabulary(writer, folder, config, pre)

    for name, tensor in load_file(folder / "model.safetensors").items():
        values = tensor.float().numpy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            values = values + np.float32(1.0)  # Gemma3Model.modify_tensors: llama.cpp scales by w, Gemma by 1 + w
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            values = permute(values, heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = permute(values, kv_heads)
        if keep is not None:
            values = keep(gguf_name(name, arch), values)
            if values is None:
                continue
        kind = tensor_type(gguf_name(name, arch), qtype)
        raw_kind = GGMLQuantizationType[kind.upper()] if values.ndim == 2 else GGMLQuantizationType.F32
        writer.add_tensor(gguf_name(name, arch), quantized(values, kind), raw_dtype=raw_kind)
    if scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", _llama3_factors(config, head_dim))
    for name, values in extra_tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _gemma3_keys(writer: GGUFWriter, config: dict) -> dict:
    """Gemma3Model.set_gguf_parameters' own key: the sliding window (llama.cpp assumes the rest of Gemma 3: a global
    layer every sixth, the local layers' rope base 10000, scores scaled by head size ** -0.5)."""
    writer.add_sliding_window(config["sliding_window"])
    return {}


def _phi3_keys(writer: GGUFWriter, config: dict) -> dict:
    """Phi3MiniModel.set_gguf_parameters and generate_extra_tensors: the rotary dims, the sliding window (0: none, as
    Phi-4-mini), the original context and LongRoPE's attention factor and factor tensors."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    writer.add_rope_dimension_count(int(config.get("partial_rotary_factor", 1.0) * hidden) // heads)
    writer.add_sliding_window(config.get("sliding_window") or 0)
    original = config.get("original_max_position_embeddings", config["max_position_embeddings"])
    writer.add_rope_scaling_orig_ctx_len(original)
    scaling = config.get("rope_scaling")
    if not scaling:
        return {}
    scale = config["max_position_embeddings"] / original
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
    return {"rope_factors_long.weight": np.array(scaling["long_factor"], dtype=np.float32),
            "rope_factors_short.weight": np.array(scaling["short_factor"], dtype=np.float32)}


_FAMILY_KEYS = {"gemma3": _gemma3_keys, "phi3": _phi3_keys}


def reference_folder(folder: Path, out: Path, qtype: str | dict, dtype: torch.dtype | None = None) -> Path:
    """`folder` holding what the GGUF of `qtype` holds, in `dtype` (default: bfloat16 for bf16 files, float16 for f16
    and quantized ones, as edge stores them when dequantizing): the checkpoint a GGUF must load as."""
    out.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, out / item.name)
    dtype = dtype or {"f32": torch.float32, "bf16": torch.bfloat16}.get(qtype, torch.float16)
    arch = ARCHS[json.loads((folder / "config.json").read_text())["architectures"][0]]
    state = {name: torch.from_numpy(held_values(tensor.float().numpy(),
                                                tensor_type(gguf_name(name, arch), qtype))).to(dtype)
             for name, tensor in load_file(folder / "model.safetensors").items()}
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _add_vocabulary(writer: GGUFWriter, folder: Path, config: dict, pre: str) -> None:
    """convert_hf_to_gguf.py's _set_vocab_gpt2 and gguf.SpecialVocab for a byte-level BPE tokenizer.json."""
    data = json.loads((folder / "tokenizer.json").read_text())
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    vocabulary = {token: index for token, index in data["model"]["vocab"].items()}
    added = {entry["id"]: entry for entry in data["added_tokens"]}
    vocabulary.update({entry["content"]: index for index, entry in added.items()})
    by_id = {index: token for token, index in vocabulary.items()}
    tokens, types = [], []
    for index in range(config["vocab_size"]):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(TokenType.UNUSED)
            continue
        tokens.append(by_id[index])
        types.append(TokenType.NORMAL if index not in added else
                     TokenType.CONTROL if added[index]["special"] else TokenType.USER_DEFINED)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for name, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("pad", writer.add_pad_token_id)):
        token = settings.get(f"{name}_token")
        index = vocabulary.get(token) if isinstance(token, str) else config.get(f"{name}_token_id")
        if isinstance(index, int):
            add(index)
    if "add_bos_token" in settings:
        writer.add_add_bos_token(settings["add_bos_token"])
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text() if template_file.is_file() else settings.get("chat_template")
    if template:
        writer.add_chat_template(template)


def _llama3_factors(config: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: Llama 3's rope scaling as one factor per
    frequency."""
    scaling = config["rope_scaling"]
    base = config.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)
