"""Weight and KV-cache quantization (the reference paths) and QuantSpec self-drafting on them."""

from __future__ import annotations

import pytest
import torch

from edge import EdgeError, Engine
from edge.model.quantized_kv_cache import QuantizedKVCache
from edge.kernels.kv_quant import dequantize, quantize
from edge.kernels.quant import QuantizedLinear, load_quantized, quantize_weight, save_quantized
from tests.helpers import greedy

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "import os\nfor name in"]


@pytest.mark.parametrize("bits, tolerance", [(8, 0.01), (4, 0.15)])
def test_weight_quantization_round_trips_within_its_precision(bits, tolerance):
    torch.manual_seed(0)
    weight = torch.randn(48, 64)
    quantized = quantize_weight(weight, bits=bits, group_size=32)
    error = (quantized.dequantize() - weight).norm() / weight.norm()
    assert error < tolerance
    assert quantized.scales.shape == (48, 2) and quantized.codes.shape == (48, 64 if bits == 8 else 32)
    codes = quantized.signed_codes()
    assert codes.min() >= -(2 ** (bits - 1)) and codes.max() <= 2 ** (bits - 1) - 1
    x = torch.randn(3, 64)
    layer = QuantizedLinear(quantized, bias=torch.ones(48))
    assert torch.allclose(layer(x), x @ quantized.dequantize().T + 1, atol=1e-5)


def test_group_sizes_that_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="does not divide the input dimension 64"):
        quantize_weight(torch.randn(8, 64), bits=4, group_size=24)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        quantize_weight(torch.randn(8, 64), bits=3)


def test_saved_format_describes_itself(tmp_path):
    torch.manual_seed(1)
    quantized = quantize_weight(torch.randn(16, 32), bits=4, group_size=16)
    save_quantized({"layer.weight": quantized, "norm.weight": torch.ones(32)}, tmp_path / "q.safetensors",
                   bits=4, group_size=16)
    loaded = load_quantized(tmp_path / "q.safetensors")
    assert torch.equal(loaded["layer.weight"].dequantize(), quantized.dequantize())
    assert torch.equal(loaded["norm.weight"], torch.ones(32))
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="not written by edge's quantizer"):
        load_quantized(tmp_path / "plain.safetensors")


@pytest.mark.parametrize("kind", ["int8", "int4", "hierarchical"])
def test_kv_vectors_are_quantized_each_on_its_own(kind):
    torch.manual_seed(2)
    x = torch.randn(1, 2, 5, 16)  # (B, H, T, Dh)
    together = dequantize(quantize(x, kind))
    one_by_one = torch.cat([dequantize(quantize(x[:, :, t:t + 1], kind)) for t in range(5)], dim=2)
    assert torch.equal(together, one_by_one)  # a verify pass stores what single steps store
    bound = {"int8": 0.01, "int4": 0.2, "hierarchical": 0.01}[kind]
    assert (together - x).norm() / x.norm() < bound


def test_hierarchical_draft_view_is_the_upper_four_bits():
    torch.manual_seed(3)
    x = torch.randn(4, 64)
    packed = quantize(x, "hierarchical")
    target, draft = dequantize(packed), dequantize(packed, draft=True)
    assert (target - x).norm() / x.norm() < 0.01
    assert 0.01 < (draft - x).norm() / x.norm() < 0.1  # a 4-bit view of the same memory
    assert packed.planes[0].shape == (4, 32) and packed.planes[1].shape == (4, 32)


def test_quantized_cache_writes_once_and_reads_its_prefix():
    cache = QuantizedKVCache(2, 2, 16, 32, key_format="int8", value_format="int4")
    k, v = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    keys, values = cache.write(1, 0, k, v)
    assert keys.shape == (1, 2, 3, 16) and (keys - k).abs().max() < 0.05 and (values - v).abs().max() < 0.5
    # int8 keys (16 bytes + scale) and int4 values (8 bytes + scale) for 2 layers x 2 heads x 32 positions
    assert cache.nbytes == 2 * 2 * 32 * ((16 + 2) + (8 + 2))


@pytest.fixture(scope="module")
def target(checkpoint_factory):
    return checkpoint_factory("llama3")


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache", ["int8", "int8-int4", "hierarchical"])
def test_speculation_over_a_quantized_cache_equals_plain_decoding_over_it(kv_cache, target):
    plain = Engine.load(target, max_context=256, kv_cache=kv_cache)
    for drafter in ("ngram", "early-exit:1"):
        fast = Engine.load(target, max_context=256, kv_cache=kv_cache, drafter=drafter, draft_length=3)
        for prompt in PROMPTS:
            assert greedy(fast, prompt, 96) == greedy(plain, prompt, 96), (kv_cache, drafter, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("length", ["adaptive", 2, 5])
@pytest.mark.parametrize("view", ["both planes", "upper plane"])
def test_quantspec_is_lossless(bits, length, view, target):
    plain = Engine.load(target, max_context=256, kv_cache="hierarchical")
    fast = Engine.load(target, max_context=256, drafter=f"quantspec:{bits}", draft_length=length)
    assert fast.kv_cache == "hierarchical"  # selected for the QuantSpec draft
    fast.drafter.upper_plane_from = 0 if view == "upper plane" else 10**9  # else chosen by the model's size
    for prompt in PROMPTS:
        assert greedy(fast, prompt, 96) == greedy(plain, prompt, 96), (bits, length, prompt)
    if length == "adaptive":  # it may have paused by now where drafting measured slower (timing-dependent)
        fast.use_drafter(fast.drafter, 2)
    stats = list(fast.generate(PROMPTS[0], max_new_tokens=32, ignore_eos=True))[-1].stats
    assert stats.drafted > 0 and stats.accepted > 0
    assert 0 < fast.drafter.memory_bytes() < fast.model.weight_bytes() * (0.5 if bits == 4 else 0.6)


def test_quantspec_reads_the_upper_plane_once_the_cache_outweighs_a_quarter_of_its_weights(target):
    from edge.decoding.drafters.quantspec import UPPER_PLANE_SHARE

    engine = Engine.load(target, max_context=256, drafter="quantspec")
    drafter, config = engine.drafter, engine.model.config
    per_token = 2 * config.num_layers * config.num_kv_heads * (config.head_dim + 4)  # 8-bit codes, step, low
    assert drafter.upper_plane_from == int(UPPER_PLANE_SHARE * drafter._bytes_per_drafted_token() / per_token)
    assert not drafter.reads_upper_plane(drafter.upper_plane_from - 1) and drafter.reads_upper_plane(
        drafter.upper_plane_from)
    head = drafter.model.packed_head  # the float head gets an 8-bit copy in blocks: it is read once per drafted token
    assert head is not None and head.formats == ["q8_0"] and head is not engine.model.packed_head


def test_quantspec_samples_and_refuses_a_plain_cache(target):
    engine = Engine.load(target, max_context=256, drafter="quantspec")
    events = list(engine.generate(PROMPTS[0], max_new_tokens=24, temperature=0.8, seed=1, ignore_eos=True))
    assert sum(len(e.token_ids) for e in events) == 24
    plain = Engine.load(target, max_context=256)
    with pytest.raises(EdgeError, match="hierarchical KV cache"):
        plain.use_drafter("quantspec")


@pytest.fixture(scope="module")
def odd_mlp_target(tmp_path_factory, tokenizer_dir) -> Path:
    """A llama checkpoint whose MLP is 172 wide: no group size of 32 or 64 divides it."""
    from tests.conftest import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("mlp172"), "llama3", tokenizer_dir, intermediate_size=172)


@pytest.mark.parametrize("case", ["float16 weights", "int8 target", "int4 target", "172-wide MLP"])
def test_quantspec_runs_on_the_cpu_kernel_for_any_target(case, target, half_llama_dir, odd_mlp_target):
    from edge.model.block_weights import BlockLinear

    path = {"float16 weights": half_llama_dir, "172-wide MLP": odd_mlp_target}.get(case, target)
    weights = {"int8 target": "int8", "int4 target": "int4"}.get(case)
    plain = Engine.load(path, max_context=256, kv_cache="hierarchical", weights=weights)
    fast = Engine.load(path, max_context=256, drafter="quantspec", draft_length=3, weights=weights)
    for prompt in PROMPTS:
        assert greedy(fast, prompt, 96) == greedy(plain, prompt, 96), (case, prompt)
    projections = [m for m in fast.drafter.model.layers.modules() if isinstance(m, BlockLinear)]
    assert len(projections) == 4 * fast.model.config.num_layers and {m.format for m in projections} == {"q4_1"}
    targets = [m.matrix.segments[0][2] for m in fast.model.layers.modules() if isinstance(m, BlockLinear)]
    assert all(m.matrix.segments[0][2].data_ptr() != t.data_ptr() for m, t in zip(projections, targets))


def test_quantized_linear_pads_a_width_its_group_size_does_not_divide():
    from torch import nn

    linear = nn.Linear(172, 24, bias=False)
    layer = QuantizedLinear.from_linear(linear, bits=4, group_size=32)
    x = torch.randn(3, 172)
    reference = layer.quantized.dequantize()[:, :172]  # (24, 172): the zero columns dropped
    assert layer.in_features == 172 and layer.quantized.shape == (24, 192)
    torch.testing.assert_close(layer(x), x @ reference.T)
    assert (layer.quantized.dequantize()[:, 172:] == 0).all()
