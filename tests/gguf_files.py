"""Small GGUF files written from a Hugging Face checkpoint folder the way llama.cpp's convert_hf_to_gguf.py writes
them (the metadata keys, the q/k row permutation of Llama layers, Llama 3's rope_freqs, the byte-level BPE
vocabulary), and the reference those files should load as: the same checkpoint holding the values the file holds.
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

QTYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16, "bf16": GGMLQuantizationType.BF16,
          "q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}
ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name: str) -> str:
    if name.startswith("model.layers."):
        layer, rest = name.removeprefix("model.layers.").split(".", 1)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{NAMES[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py): each head's rows (2, D/2) -> (D/2, 2)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def held_values(values: np.ndarray, qtype: str) -> np.ndarray:
    """What a GGUF of this type holds for a tensor, as float32 (1-D tensors stay float32, as in llama.cpp)."""
    kind = QTYPES[qtype] if values.ndim == 2 else GGMLQuantizationType.F32
    return quants.dequantize(quants.quantize(values, kind), kind).astype(np.float32)


def write_gguf(folder: Path, out: Path, qtype: str = "f32", *, pre: str = "gpt-2") -> Path:
    config = json.loads((folder / "config.json").read_text())
    arch = ARCHS[config["architectures"][0]]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = GGUFWriter(out, arch)
    writer.add_name(folder.name)
    writer.add_uint32("general.file_type", {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2}[qtype])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    _add_vocabulary(writer, folder, config, pre)

    for name, tensor in load_file(folder / "model.safetensors").items():
        values = tensor.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            values = permute(values, heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = permute(values, kv_heads)
        kind = QTYPES[qtype] if values.ndim == 2 else GGMLQuantizationType.F32
        writer.add_tensor(gguf_name(name), quants.quantize(values, kind), raw_dtype=kind)
    if scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", _llama3_factors(config, head_dim))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def reference_folder(folder: Path, out: Path, qtype: str) -> Path:
    """`folder` holding what the GGUF of `qtype` holds (in bfloat16 for bf16 files, float16 for f16 and quantized
    ones, as edge stores them): the checkpoint a GGUF must load as."""
    out.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, out / item.name)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}.get(qtype, torch.float16)
    state = {name: torch.from_numpy(held_values(tensor.float().numpy(), qtype)).to(dtype)
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
