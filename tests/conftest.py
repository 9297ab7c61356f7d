"""Fixtures: tiny random checkpoints of every supported family, built with transformers and `save_pretrained`.

Nothing is downloaded: weights are random (seeded) and the tokenizer is a byte-level BPE trained here on a few
paragraphs. Each family's checkpoint is built once per test session.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. def main(): return sum(range(10))",
    "Speculative decoding drafts several tokens and verifies them in one pass of the full model.",
    "import os\nfor name in os.listdir('.'):\n    print(name.upper())\n",
    "Les modèles de langue tournent sur l'ordinateur portable. 日本語のテキストも少し。 emoji: 🙂🚀",
    "A KV cache keeps the keys and values of every position so that decoding is linear in time.",
] * 4

# family -> (transformers config class name, model class name, config overrides)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama2": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=32),
    )),
    "llama_bias_linear_rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        attention_bias=True, mlp_bias=True, rope_scaling=dict(type="linear", factor=2.0))),
    "tinyllama": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=64)),
    "smollm": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=24, head_dim=24)),
    # six layers, a global one every sixth (Gemma 3's pattern, which llama.cpp assumes): both kinds of layer run, the
    # local ones with a window shorter than the tests' sequences
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16, sliding_window=8, rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0, pad_token_id=0)),
    # what a checkpoint folder may also say: scores scaled other than by head size, linear rope scaling on the global
    # layers (Gemma 3 4B), capped logits
    "gemma3_scaled": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=24, sliding_window=6, sliding_window_pattern=2,
        rope_scaling=dict(rope_type="linear", factor=8.0), final_logit_softcapping=30.0, pad_token_id=0)),
    # Phi-4-mini's partial rotary (half of each head here)
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5, pad_token_id=0, num_key_value_heads=2)),
    # Phi-3.5-mini's LongRoPE: the short factors within the original context (the tests stay within its 128
    # positions), cos and sin scaled for the longer context
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", dict(
        pad_token_id=0, original_max_position_embeddings=128, max_position_embeddings=1024,
        rope_scaling=dict(type="longrope", short_factor=[1.0 + 0.1 * i for i in range(8)],
                          long_factor=[2.0 + 0.5 * i for i in range(8)]))),
}
# Tiny models gain nothing from threads, and with other work on the machine extra OpenMP threads only spin.
torch.set_num_threads(1)

# Each test runs on one thread, so the suite runs in processes (pytest-xdist, `-n auto` in pyproject.toml): one per
# core, at most 4 (each builds its own session fixtures; more would mostly repeat that work). `-n 0` runs in one.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def pytest_collection_modifyitems(config, items) -> None:
    """Files with long tests (marked slow) run first, each file's tests kept together (its fixtures set up once): the
    processes then end on short tests, and neither waits long for the other at the end of a run."""
    long_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in long_files)  # stable: the order within each group is kept

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1)


def build_tokenizer(folder: Path) -> int:
    """Train a tiny byte-level BPE with ChatML special tokens, save it as a transformers tokenizer; return its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(folder)
    return len(fast)


@pytest.fixture
def builtin_default(monkeypatch):
    """Commands given no model run the built-in model, as where the default model is not installed."""
    from edge.sources import default_model

    monkeypatch.setattr(default_model, "packaged_file", lambda model=None: None)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(folder)
    return folder


def build_checkpoint(folder: Path, family: str, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    import transformers

    config_name, model_name, family_overrides = FAMILIES[family]
    from tokenizers import Tokenizer

    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    config = getattr(transformers, config_name)(**{**COMMON, **family_overrides, "vocab_size": vocab_size,
                                                   "eos_token_id": vocab_size - 1, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    model.save_pretrained(folder)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, folder / item.name)
    return folder


def transformers_greedy(folder: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy continuation of `prompt` (token ids) from a checkpoint folder, in float32."""
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference.generation_config.eos_token_id = None
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory, tokenizer_dir):
    """checkpoint_factory(family) -> folder with config.json, model.safetensors and the tokenizer files."""
    built: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in built:
            built[family] = build_checkpoint(tmp_path_factory.mktemp(family), family, tokenizer_dir)
        return built[family]

    return make


@pytest.fixture(scope="session")
def llama_dir(checkpoint_factory) -> Path:
    return checkpoint_factory("llama3")


@pytest.fixture(scope="session")
def base_dir(llama_dir, tmp_path_factory) -> Path:
    """llama_dir without a chat template: a base checkpoint."""
    folder = tmp_path_factory.mktemp("base") / "ckpt"
    shutil.copytree(llama_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def half_llama_dir(llama_dir, tmp_path_factory) -> Path:
    """llama_dir's checkpoint saved in float16 (edge keeps such weights 16-bit on the CPU)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("llama3-float16")
    for item in llama_dir.iterdir():
        shutil.copy(item, folder / item.name)
    tensors = load_file(llama_dir / "model.safetensors")
    save_file({name: t.half() for name, t in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# ---- edge's CPU kernel, one library per path this machine can run (edge/kernels/cpu_paths.py) ----

def _emulated_avx512() -> bool:
    """The avx512 path's code compiled with SIMDe's portable intrinsics (Debian: libsimde-dev), where the CPU itself
    has no AVX-512: what the code computes is checked, on any x86-64 machine."""
    from edge.kernels import cpu_paths

    return (cpu_paths.machine() == "x86_64" and "avx512" not in cpu_paths.runnable_paths()
            and Path("/usr/include/simde/x86/avx512.h").is_file())


def kernel_path_names() -> list[str]:
    from edge.kernels import cpu_paths

    return cpu_paths.runnable_paths() + (["avx512-emulated"] if _emulated_avx512() else [])


def kernel_for(name: str):
    """The kernel library of one path (or of the emulated avx512 code), built on first use; skips if it cannot be."""
    from edge.kernels import cpu_paths
    from edge.kernels.cpu_kernel import CpuKernel

    if name == "avx512-emulated":
        # -O1: SIMDe's emulation of the wider tiles takes minutes to compile at -O3, and checks the same arithmetic
        library = cpu_paths.build("avx2", ["-DEDGE_EMULATE_AVX512", "-Wno-psabi", "-O1"], label="avx512-emulated")
        return CpuKernel.open(library)
    kernel = CpuKernel.for_path(name)
    if kernel is None:
        pytest.skip(f"the {name} kernel cannot be built here (no C compiler with OpenMP)")
    return kernel


@pytest.fixture(scope="session", params=[pytest.param(name, marks=pytest.mark.slow) for name in kernel_path_names()])
def kernel(request):
    """Each CPU path's kernel in turn (every path this CPU runs, and the avx512 code under emulation). The path
    matrix builds a library per path: every test that takes this fixture is marked slow."""
    return kernel_for(request.param)
