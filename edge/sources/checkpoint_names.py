"""How each family's Hugging Face checkpoints name a decoder layer's tensors: what edge/sources/loading.py builds the
model's tensors from, and what edge/sources/gguf_weights.py reads a GGUF file's under (the names its index gives them).
"""

from __future__ import annotations

from edge.model.config import ModelConfig

# each layer's tensors in the model (its module names) -> the checkpoint's tensors they are made of, under
# model.layers.N.; a family whose checkpoints name them otherwise overrides its own entries
LLAMA_LAYER = {
    "attn_norm": ["input_layernorm"], "ffn_norm": ["post_attention_layernorm"],
    "attn.wqkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "attn.wo": ["self_attn.o_proj"],
    "ffn.w_gate_up": ["mlp.gate_proj", "mlp.up_proj"], "ffn.w_down": ["mlp.down_proj"],
    "attn.q_norm": ["self_attn.q_norm"], "attn.k_norm": ["self_attn.k_norm"],
}
LAYER_NAMES = {
    # Phi-3 stores q/k/v and gate/up fused, as the model holds them
    "Phi3ForCausalLM": {**LLAMA_LAYER, "attn.wqkv": ["self_attn.qkv_proj"], "ffn.w_gate_up": ["mlp.gate_up_proj"]},
    # Gemma's post_attention_layernorm normalizes the attention's output; pre_feedforward_layernorm is the ffn's input
    "Gemma3ForCausalLM": {**LLAMA_LAYER, "ffn_norm": ["pre_feedforward_layernorm"],
                          "post_attn_norm": ["post_attention_layernorm"],
                          "post_ffn_norm": ["post_feedforward_layernorm"]},
}


def layer_names(config: ModelConfig) -> dict[str, list[str]]:
    """The model's layer tensors -> the checkpoint's names they are made of (LAYER_NAMES), for this config's
    family."""
    return LAYER_NAMES.get(config.architecture, LLAMA_LAYER)


# a multimodal checkpoint's text model under the names a text-only one uses: Gemma 3 4B and up as transformers saves
# Gemma3ForConditionalGeneration (language_model.model.*), and as its newer layout names them (model.language_model.*)
TEXT_MODEL_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                       "language_model.lm_head.": "lm_head."}
