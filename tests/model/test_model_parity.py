"""edge's model against transformers' on tiny random checkpoints of every supported family (fp32, 1e-4)."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.conftest import FAMILIES
from edge.engine import Engine
from edge.model.kv_cache import KVCache
from edge.sources.loading import load_model
from edge.text.tokenizer import Tokenizer

TOLERANCE = 1e-4


def hf_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers(checkpoint_factory, family):
    folder = checkpoint_factory(family)
    model, reference = load_model(folder), hf_model(folder)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, 48), generator=generator)  # (1, 48)
    with torch.no_grad():
        expected = reference(ids).logits  # (1, 48, V)
        cache = KVCache.for_model(model.config, 64)

        def run(start: int, end: int) -> float:
            logits = model.logits(model(ids[:, start:end], start, cache))
            return (logits - expected[:, start:end]).abs().max().item()

        assert run(0, 20) < TOLERANCE  # prefill
        assert run(20, 21) < TOLERANCE  # single-token decode
        assert run(21, 30) < TOLERANCE  # multi-token step (verification of drafted tokens)
        cache.rollback(26)  # reject the last four, continue from an arbitrary position
        assert run(26, 27) < TOLERANCE
        assert run(27, 48) < TOLERANCE  # multi-token step past the mistral sliding window


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generation_matches_transformers(checkpoint_factory, family):
    folder = checkpoint_factory(family)
    engine = Engine(load_model(folder), Tokenizer.from_dir(folder), max_context=256)
    reference = hf_model(folder)
    reference.generation_config.eos_token_id = None
    prompt = [5, 17, 42, 99, 3, 250, 7]
    ours = [t for event in engine.generate(prompt, max_new_tokens=64, temperature=0.0, ignore_eos=True) for t in event.token_ids]
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False,
                                 pad_token_id=0)
    assert ours == out[0, len(prompt):].tolist()


def test_subset_of_layers_equals_truncated_model(checkpoint_factory):
    """Running layers [0, 2) must equal a model that only has those layers (early exit shares the weights)."""
    folder = checkpoint_factory("llama3")
    model = load_model(folder)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        full_cache = KVCache.for_model(model.config, 16)
        early = model(ids, 0, full_cache, layers=range(2))  # (1, 6, D)
        assert full_cache.length == 0  # a partial pass does not advance the verified length
        reference = hf_model(folder)
        reference.model.layers = reference.model.layers[:2]
        hidden = reference.model(ids).last_hidden_state
    assert (early - hidden).abs().max().item() < TOLERANCE
    skip = model(ids, 0, KVCache.for_model(model.config, 16), layers=[0, 2])
    assert skip.shape == early.shape and not torch.allclose(skip, early)


def test_logits_over_a_vocabulary_subset(checkpoint_factory):
    model = load_model(checkpoint_factory("smollm"))
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    subset = torch.tensor([3, 10, 11, 200])
    with torch.no_grad():
        hidden = model(ids, 0, KVCache.for_model(model.config, 8))
        full, part = model.logits(hidden), model.logits(hidden, vocab_subset=subset)
    assert part.shape == (1, 6, 4)
    torch.testing.assert_close(part, full[..., subset])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_loads_and_stays_close(checkpoint_factory, dtype):
    folder = checkpoint_factory("qwen3")
    full, half = load_model(folder), load_model(folder, dtype=dtype)
    assert half.embed.weight.dtype == getattr(torch, dtype)
    ids = torch.tensor([[9, 8, 7, 6, 5]])
    with torch.no_grad():
        a = full.logits(full(ids, 0, KVCache.for_model(full.config, 8)))
        cache = KVCache.for_model(half.config, 8, dtype=getattr(torch, dtype))
        b = half.logits(half(ids, 0, cache)).float()
    assert cache.keys.dtype == getattr(torch, dtype)
    assert (a - b).abs().max().item() < 0.1


def test_a_longrope_scaling_without_its_factors_is_one_line(checkpoint_factory):
    from edge.errors import CheckpointError
    from edge.model.config import ModelConfig, read_config_json

    raw = read_config_json(checkpoint_factory("phi3_longrope"))
    raw["rope_scaling"] = {**raw["rope_scaling"], "short_factor": [1.0, 1.0]}
    with pytest.raises(CheckpointError, match="8 short and long factors"):
        ModelConfig.from_hf(raw)


def test_gemma_and_phi3_fuse_as_llama_does_while_only_llama_is_the_llama_layout(checkpoint_factory):
    """The fused C calls read every family's layers: Gemma 3's and Phi-3's decode steps fuse wherever the kernel is
    built, as a Llama's do; llama_layout (what edge's own ONNX graphs and the GPU's static step compute) stays the
    Llama's alone."""
    ids = torch.tensor([[4, 8, 15, 16, 23]])
    for family, layout in (("gemma3", False), ("phi3", False), ("llama3", True)):
        model = load_model(checkpoint_factory(family))
        assert model.config.llama_layout is layout
        with torch.no_grad():
            cache = KVCache.for_model(model.config, 8)
            model.forward_logits(ids[:, :4], 0, cache)
            model.forward_logits(ids[:, 4:], 4, cache)
        if model.runner.matmul is not None:
            assert model.runner.fused_format == "float32", family


def test_gemma3s_multimodal_checkpoint_runs_its_text_model(tmp_path, tokenizer_dir):
    """Gemma 3 4B and up ship as Gemma3ForConditionalGeneration: the text model's logits equal transformers' for text
    alone, from a config.json whose text_config leaves transformers' defaults out (as the Hub's files do)."""
    import json
    import shutil

    from tests.conftest import COMMON

    text = transformers.Gemma3TextConfig(**{**COMMON, "vocab_size": 320, "num_hidden_layers": 4, "head_dim": 16,
                                            "sliding_window": 8, "sliding_window_pattern": 2})
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=4, image_token_index=300, boi_token_index=301,
                                       eoi_token_index=302)
    torch.manual_seed(0)
    transformers.Gemma3ForConditionalGeneration(config).eval().save_pretrained(tmp_path)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, tmp_path / item.name)
    saved = json.loads((tmp_path / "config.json").read_text())
    defaults = transformers.Gemma3TextConfig().to_dict()
    saved["text_config"] = {key: value for key, value in saved["text_config"].items() if defaults.get(key) != value}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert "query_pre_attn_scalar" not in saved["text_config"] and "rope_theta" not in saved["text_config"]

    model = load_model(tmp_path)
    assert model.config.architecture == "Gemma3ForCausalLM" and model.config.num_layers == 4
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = transformers.Gemma3ForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32)(
            input_ids=ids).logits
        got = model.logits(model(ids, 0, KVCache.for_model(model.config, 32)))
    assert (got - expected).abs().max().item() < TOLERANCE
    from tests.helpers import greedy

    plain = greedy(tmp_path, "The quick brown fox", 16)
    assert greedy(tmp_path, "The quick brown fox", 16, drafter="early-exit:1") == plain
