"""The Triton kernels against their torch references, on fresh random inputs, through Triton's CPU interpreter.

TRITON_INTERPRET=1 must be set before triton compiles the kernels, so this module sets it at import; the
dispatcher only routes CPU tensors to Triton when a test also sets EDGE_TRITON_ON_CPU=1."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from edge.kernels import triton_kernels as tk  # noqa: E402
from edge.kernels.kv_quant import dequantize, quantize  # noqa: E402
from edge.kernels.quant import QuantizedLinear, quantize_weight  # noqa: E402


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows, n, k, group", [(1, 48, 64, 32), (5, 40, 96, 16), (3, 33, 128, 64),
                                               (2, 24, 96, 24), (3, 8, 4096, 16)])
def test_quantized_matmul_matches_the_reference(bits, rows, n, k, group):
    generator = torch.Generator().manual_seed(rows * n + k + bits)
    weight = quantize_weight(torch.randn(n, k, generator=generator), bits=bits, group_size=group)
    x = torch.randn(rows, k, generator=generator)
    expected = x @ weight.dequantize().T  # (rows, n)
    got = tk.quantized_matmul(x, weight)
    assert torch.allclose(got, expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)
    for row in range(rows):  # each row alone gives exactly its row of the multi-row pass (what keeps verify exact)
        assert torch.equal(tk.quantized_matmul(x[row:row + 1], weight)[0], got[row])


def test_a_narrow_long_weight_is_split_along_its_inputs():
    assert tk.split_groups(tiles=1, groups=512, block_g=2, device=torch.device("cpu"))[0] > 1
    assert tk.split_groups(tiles=512, groups=512, block_g=2, device=torch.device("cpu")) == (1, 512)


@pytest.mark.parametrize("kind", ["int8", "hierarchical"])
@pytest.mark.parametrize("dims", [16, 64, 24])
def test_quantize_on_append_writes_the_reference_codes(kind, dims):
    x = torch.randn(3, 5, dims, generator=torch.Generator().manual_seed(dims))
    got, expected = tk.quantize_vectors(x, kind), quantize(x, kind)
    for plane, reference in zip(got.planes, expected.planes):
        assert torch.equal(plane, reference)
    assert torch.equal(got.scale, expected.scale)
    if kind == "hierarchical":
        assert torch.equal(got.low, expected.low)
    assert torch.equal(dequantize(got), dequantize(expected))


@pytest.mark.slow
@pytest.mark.parametrize("kind, draft", [("int8", False), ("hierarchical", False), ("hierarchical", True)])
@pytest.mark.parametrize("heads, kv_heads, start, steps", [(4, 2, 36, 1), (2, 2, 4, 1), (6, 3, 40, 3)])
def test_decode_attention_over_a_quantized_cache(kind, draft, heads, kv_heads, start, steps):
    generator = torch.Generator().manual_seed(heads + start)
    dims, max_len = 32, 80
    keys = quantize(torch.randn(kv_heads, max_len, dims, generator=generator), kind)
    values = quantize(torch.randn(kv_heads, max_len, dims, generator=generator), kind)
    q = torch.randn(steps, heads, dims, generator=generator)
    group = heads // kv_heads
    k = dequantize(keys, draft=draft).repeat_interleave(group, 0)  # (H, S_max, D)
    v = dequantize(values, draft=draft).repeat_interleave(group, 0)
    got = tk.quantized_decode_attention(q, keys, values, start, draft=draft, block_s=16, chunk=32)  # (T, H, D)
    for t in range(steps):  # query t sees positions [0, start + t]
        seen = start + t + 1
        weights = torch.softmax((k[:, :seen] @ q[t][:, :, None])[..., 0] * dims ** -0.5, dim=-1)  # (H, S)
        expected = (weights[:, None, :] @ v[:, :seen])[:, 0]  # (H, D)
        assert torch.allclose(got[t], expected, atol=1e-4, rtol=1e-4)
    # each query alone gives exactly its row of the multi-query pass (what makes speculation exact)
    for t in range(steps):
        alone = tk.quantized_decode_attention(q[t:t + 1], keys, values, start + t, draft=draft, block_s=16,
                                              chunk=32)
        assert torch.equal(alone[0], got[t])


def test_the_dispatcher_routes_cpu_tensors_only_when_asked(monkeypatch):
    from edge.kernels.dispatch import use_triton

    layer = QuantizedLinear(quantize_weight(torch.randn(16, 32), bits=4, group_size=16), bias=torch.ones(16))
    x = torch.randn(2, 32)
    reference = layer(x)
    assert not use_triton(x)
    monkeypatch.setenv("EDGE_TRITON_ON_CPU", "1")
    assert use_triton(x)
    assert torch.allclose(layer(x), reference, atol=1e-5)


def test_quantspec_through_the_kernels_equals_plain_decoding_through_them(monkeypatch, checkpoint_factory):
    """The fused path end to end (what a GPU runs), through the interpreter: quantize-on-append, attention from
    the packed cache (the draft's upper-nibble view and the target's 8 bits), int4 matmuls in the draft."""
    from edge import Engine

    monkeypatch.setenv("EDGE_TRITON_ON_CPU", "1")
    target = checkpoint_factory("llama3")
    reference = Engine.load(target, max_context=64, kv_cache="hierarchical")
    prompt = "The quick brown fox"
    plain = [t for e in reference.generate(prompt, max_new_tokens=12, temperature=0.0, ignore_eos=True) for t in e.token_ids]
    fast = Engine.load(target, max_context=64, drafter="quantspec", draft_length=3)
    events = list(fast.generate(prompt, max_new_tokens=12, temperature=0.0, ignore_eos=True))
    assert [t for e in events for t in e.token_ids] == plain
    assert events[-1].stats.drafted > 0
    monkeypatch.delenv("EDGE_TRITON_ON_CPU")  # the reference path gives the same tokens here too
    reference.reset()
    assert [t for e in reference.generate(prompt, max_new_tokens=12, temperature=0.0, ignore_eos=True) for t in e.token_ids] == plain
