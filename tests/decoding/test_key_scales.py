"""Outlier key channels (Qwen-style) in a quantized KV cache: edge/model/key_scales.py finds them and the cache divides
them down before quantizing, so QuantSpec's 4-bit draft view keeps agreeing with the target.

The outlier target is the built-in model with two low-frequency rotary pairs of every key head multiplied by 32 and
the matching query channels divided by 32: the same model (q·k unchanged, exactly: powers of two), whose keys now
have the large channels Qwen's have."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.model.calibration import CALIBRATION_TEXT
from edge.model.kernel_glue import use_kernel
from edge.model.key_scales import outlier_key_scales, pair_magnitudes
from edge.sources.loading import load_model
from edge.model.quantized_kv_cache import QuantizedKVCache
from edge.text.tokenizer import Tokenizer
from tests.kernels.test_hierarchical_kv_kernel import fused_and_reference
from edge.kernels.kv_quant import quantize
from tests.helpers import greedy

FACTOR = 32.0
PROMPTS = ["How do I read a CSV file in Python?", "Write a function that reverses a list.",
           "What does the json module do?", "Explain what a dictionary is.", "How do I copy a file?"]


@pytest.fixture(scope="module")
def builtin() -> Path:
    path = builtin_model_path()
    if path is None:
        pytest.skip("the built-in model is not in this checkout")
    return path


def outlier_pairs(head_dim: int) -> list[int]:
    return [head_dim // 2 - 1, head_dim // 2 - 3]  # low-frequency pairs, where Qwen's large key channels sit


@pytest.fixture(scope="module")
def outlier_target(builtin, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("outlier-keys") / "model"
    shutil.copytree(builtin, folder)
    config = json.loads((folder / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    weights_file = folder / "model.safetensors"
    weights = load_file(weights_file)
    for name in [n for n in weights if n.endswith("self_attn.k_proj.weight")]:
        query = name.replace("k_proj", "q_proj")
        keys = weights[name].clone().view(kv_heads, head_dim, -1)  # (Hkv, Dh, D)
        queries = weights[query].clone().view(heads, head_dim, -1)  # (H, Dh, D)
        for pair in outlier_pairs(head_dim):
            for channel in (pair, pair + head_dim // 2):
                keys[:, channel] *= FACTOR
                queries[:, channel] /= FACTOR
        weights[name], weights[query] = keys.reshape(kv_heads * head_dim, -1), queries.reshape(heads * head_dim, -1)
    save_file(weights, weights_file, metadata={"format": "pt"})
    return folder


def quantspec_acceptance(engine: Engine) -> float:
    accepted = drafted = 0
    for prompt in PROMPTS:
        engine.reset()
        stats = list(engine.chat([{"role": "user", "content": prompt}], max_new_tokens=48, temperature=0.0))[-1].stats
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    return accepted / drafted


def test_the_outlier_target_is_the_same_model(builtin, outlier_target):
    plain, outliers = Engine.load(builtin, max_context=256), Engine.load(outlier_target, max_context=256)
    for prompt in PROMPTS[:2]:
        messages = [{"role": "user", "content": prompt}]
        assert greedy(outliers, messages, 40, ignore_eos=False) == greedy(plain, messages, 40, ignore_eos=False)


def test_the_scales_find_the_outlier_pairs_and_nothing_in_an_ordinary_model(builtin, outlier_target):
    ids = Tokenizer.from_dir(builtin).encode(CALIBRATION_TEXT)
    assert outlier_key_scales(load_model(builtin), ids) is None  # no pair stands out: the cache runs as before
    model = load_model(outlier_target)
    scales = outlier_key_scales(model, ids)
    head_dim = model.config.head_dim
    assert scales.shape == (model.config.num_layers, model.config.num_kv_heads, head_dim)
    assert torch.equal(torch.exp2(torch.log2(scales).round()), scales)  # powers of two: exact both ways
    outliers = [c for pair in outlier_pairs(head_dim) for c in (pair, pair + head_dim // 2)]
    ordinary = [c for c in range(head_dim) if c not in outliers]
    assert (scales[..., outliers] > 1).all() and (scales[..., ordinary] == 1).all()
    magnitude = pair_magnitudes(model, ids)  # (L, Hkv, Dh / 2): scaled, each outlier pair is no larger than the rest
    largest_ordinary = magnitude[..., [c for c in ordinary if c < head_dim // 2]].amax(dim=-1)  # (L, Hkv)
    for pair in outlier_pairs(head_dim):
        scaled = magnitude[..., pair] / scales[..., pair]
        assert (scaled <= largest_ordinary).all() and (scaled * 2 > largest_ordinary).all()


@pytest.mark.slow
def test_quantspec_keeps_its_acceptance_on_outlier_keys(builtin, outlier_target):
    original = Engine.load(builtin, max_context=256, drafter="quantspec", draft_length=3)
    original.drafter.upper_plane_from = 0
    reference = quantspec_acceptance(original)  # the same model without outlier keys
    engine = Engine.load(outlier_target, max_context=256, drafter="quantspec", draft_length=3)
    assert engine.cache.key_scales is not None  # measured when the quantized cache was made
    engine.drafter.upper_plane_from = 0  # the draft reads the 4-bit view, where per-token keys fail
    with_scales = quantspec_acceptance(engine)
    engine.reset()
    engine.cache.key_scales = None
    without = quantspec_acceptance(engine)
    assert with_scales >= reference - 0.05 and without < reference - 0.2, (reference, with_scales, without)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["quantspec", "ngram"])
def test_speculation_over_scaled_keys_equals_plain_decoding_over_them(outlier_target, drafter):
    plain = Engine.load(outlier_target, max_context=256, kv_cache="hierarchical")
    fast = Engine.load(outlier_target, max_context=256, kv_cache="hierarchical", drafter=drafter, draft_length=3)
    assert plain.cache.key_scales is not None and fast.cache.key_scales is not None
    if drafter == "quantspec":
        fast.drafter.upper_plane_from = 0
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        assert greedy(fast, messages, 40, ignore_eos=False) == greedy(plain, messages, 40, ignore_eos=False), prompt


def test_the_kernel_stores_keys_divided_by_their_scales(kernel):
    generator = torch.Generator().manual_seed(5)
    steps, kv_heads, head_dim = 5, 2, 16
    keys = torch.randn(steps, kv_heads, head_dim, generator=generator)  # (T, Hkv, Dh)
    keys[..., [3, 11]] *= 40  # an outlier pair
    values = torch.randn(steps, kv_heads, head_dim, generator=generator)
    scales = torch.ones(2, kv_heads, head_dim)
    scales[1, :, [3, 11]] = 32.0
    cache = QuantizedKVCache(2, kv_heads, head_dim, 16, key_format="hierarchical", value_format="hierarchical")
    cache.key_scales = scales
    kernel.store_hierarchical(cache.kernel_cache(), 1, keys, values, 2)
    expected = quantize((keys / scales[1]).transpose(0, 1), "hierarchical")  # (Hkv, T, ...): the reference, divided
    for plane, reference in zip(cache.keys_store.planes, expected.planes):
        assert torch.equal(plane[1, 0, :, 2:2 + steps], reference)
    assert torch.equal(cache.keys_store.scale[1, 0, :, 2:2 + steps], expected.scale)
    values_expected = quantize(values.transpose(0, 1), "hierarchical")  # values are never scaled
    assert torch.equal(cache.values_store.planes[0][1, 0, :, 2:2 + steps], values_expected.planes[0])


def test_the_fused_step_and_the_reference_path_scale_keys_alike(kernel, outlier_target):
    model = load_model(outlier_target)
    use_kernel(model, kernel)
    scales = outlier_key_scales(model, Tokenizer.from_dir(outlier_target).encode(CALIBRATION_TEXT))
    # the paths compute keys in different orders, so a value on a rounding boundary may take the next code (unscaled,
    # such a flip on an outlier channel moved this model's logits by up to 0.36 on the portable path)
    for fused, reference in zip(*fused_and_reference(model, scales)):
        torch.testing.assert_close(fused, reference, rtol=1e-2, atol=1e-2)


def test_key_scales_are_set_on_an_empty_cache_in_their_shape():
    cache = QuantizedKVCache(2, 1, 8, 16, key_format="hierarchical", value_format="hierarchical")
    with pytest.raises(ValueError, match="layers, kv heads, head dim"):
        cache.key_scales = torch.ones(2, 2, 8)
    cache.write(0, 0, torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8))
    cache.length = 3
    with pytest.raises(ValueError, match="empty cache"):
        cache.key_scales = torch.ones(2, 1, 8)
