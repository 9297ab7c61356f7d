"""QuantSpec's hierarchical KV cache in edge's fused CPU step (edge/kernels/csrc/kv_hierarchical.c): it stores exactly what
the reference quantizer (edge/kernels/kv_quant.py) stores, reads what the reference reads for the target and for the draft,
and a verify pass over it reproduces decode steps bit for bit on every path."""

from __future__ import annotations

import pytest
import torch

from edge import Engine
from edge.model.kernel_glue import ModelTensors, use_kernel
from edge.model.packed_weights import packed_format
from edge.sources.loading import load_model
from edge.model.quantized_kv_cache import QuantizedKVCache
from edge.kernels import cpu_paths
from edge.kernels.kv_quant import quantize

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.mark.parametrize("head_dim", [16, 64])
def test_the_kernel_stores_what_the_reference_quantizer_stores(kernel, head_dim):
    generator = torch.Generator().manual_seed(7)
    steps, kv_heads = 6, 2
    keys = torch.randn(steps, kv_heads, head_dim, generator=generator) * 3  # (T, Hkv, Dh)
    values = torch.randn(steps, kv_heads, head_dim, generator=generator) * 1e-3 + 5  # a narrow range far from 0
    keys[2, 1] = torch.linspace(-60000, 60000, head_dim)  # near float16's limit: a step of hundreds
    cache = QuantizedKVCache(2, kv_heads, head_dim, 16, key_format="hierarchical", value_format="hierarchical")
    kernel.store_hierarchical(cache.kernel_cache(), 1, keys, values, 3)
    for store, source in ((cache.keys_store, keys), (cache.values_store, values)):
        expected = quantize(source.transpose(0, 1), "hierarchical")  # (Hkv, T, ...)
        for plane, reference in zip(store.planes, expected.planes):
            assert torch.equal(plane[1, 0, :, 3:3 + steps], reference)
        assert torch.equal(store.scale[1, 0, :, 3:3 + steps], expected.scale)
        assert torch.equal(store.low[1, 0, :, 3:3 + steps], expected.low)
        assert not store.planes[0][0].any() and not store.planes[0][1, 0, :, :3].any()  # nothing else written


def _model_on(kernel, folder):
    model = load_model(folder)
    use_kernel(model, kernel)
    return model


def fused_and_reference(model, key_scales=None) -> list[tuple[torch.Tensor, ...]]:
    """A prompt pass, a 4-row verify pass and a draft over the 4-bit view, on a hierarchical cache through the fused
    CPU step and through the reference path (torch's attention over dequantized reads): [fused, reference]."""
    tokens = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(3))
    caches = [QuantizedKVCache.for_model(model.config, 64, key_format="hierarchical", value_format="hierarchical")
              for _ in range(2)]
    caches[1].kernel_cache = lambda: None  # the reference
    results = []
    with torch.inference_mode():
        for cache in caches:
            cache.key_scales = key_scales
            assert model.runner.fuses(ModelTensors(model), 4, torch.float32, cache) == (cache is caches[0])
            prompt = model.forward_logits(tokens[:, :20], 0, cache)[0, -1]  # (V,)
            verify = model.forward_logits(tokens[:, 20:24], 20, cache)[0]  # (4, V)
            with cache.drafting():  # the draft's 4-bit view, as a QuantSpec draft reads it
                draft = model.logits(model(tokens[:, 20:24], 20, cache, layers=[0]))[0]  # (4, V)
            results.append((prompt, verify, draft))
    return results


def test_the_fused_step_reads_the_cache_as_the_reference_path_does(kernel, llama_dir):
    for fused, reference in zip(*fused_and_reference(_model_on(kernel, llama_dir))):
        torch.testing.assert_close(fused, reference, rtol=1e-3, atol=1e-3)


def test_a_verify_pass_over_a_hierarchical_cache_reproduces_decode_steps(kernel, llama_dir):
    model = _model_on(kernel, llama_dir)
    cache = QuantizedKVCache.for_model(model.config, 64, key_format="hierarchical", value_format="hierarchical")
    tokens = torch.randint(0, model.config.vocab_size, (1, 36), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        model.forward_logits(tokens[:, :30], 0, cache)
        verify = model.forward_logits(tokens[:, 30:36], 30, cache)[0]  # (6, V)
        cache.rollback(30)
        steps = torch.cat([model.forward_logits(tokens[:, i:i + 1], i, cache)[0] for i in range(30, 36)])
    assert torch.equal(verify, steps)


@pytest.mark.parametrize("path", cpu_paths.runnable_paths())
@pytest.mark.parametrize("weights", ["float16", "int8"])
def test_quantspec_on_the_fused_step_equals_plain_decoding(llama_dir, half_llama_dir, monkeypatch, path, weights):
    monkeypatch.setenv("EDGE_CPU_KERNEL", path)
    folder = half_llama_dir if weights == "float16" else llama_dir
    packed = weights if weights == "int8" else None
    plain = Engine.load(folder, max_context=256, weights=packed, kv_cache="hierarchical")
    fast = Engine.load(folder, max_context=256, weights=packed, drafter="quantspec", draft_length=3)
    draft = fast.drafter.model
    # one C call a draft
    assert packed_format(draft) == "blocks" and draft.runner.fuses(ModelTensors(draft), 1, torch.float32, fast.cache)
    expected = [t for e in plain.generate(PROMPT, max_new_tokens=60, temperature=0.0, ignore_eos=True) for t in e.token_ids]
    events = list(fast.generate(PROMPT, max_new_tokens=60, temperature=0.0, ignore_eos=True))
    assert [t for e in events for t in e.token_ids] == expected
    assert events[-1].stats.steps < 60
