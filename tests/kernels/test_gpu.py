"""edge's GPU paths on a real CUDA device: the Triton kernels against their torch references, and whole decoding
(plain, QuantSpec, int4/int8 weights, layer offload) against plain decoding on the same device.

Skipped without a CUDA GPU of compute capability 8.0 or newer (CI has none; tests/test_triton_kernels.py checks the
same kernels through Triton's CPU interpreter there). Where a GPU is lent:

    python -m pytest -q tests/kernels/test_gpu.py
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edge.kernels.dispatch import MIN_CAPABILITY

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_CAPABILITY:
    pytest.skip("needs a CUDA GPU of compute capability 8.0 or newer", allow_module_level=True)
pytest.importorskip("triton")

from edge import Engine  # noqa: E402
from edge.sources.builtin import builtin_model_path  # noqa: E402
from edge.kernels import triton_kernels as tk  # noqa: E402
from edge.kernels.kv_quant import PackedVectors, dequantize, quantize  # noqa: E402
from edge.kernels.quant import quantize_weight  # noqa: E402
from tests.helpers import greedy  # noqa: E402

CUDA = torch.device("cuda")
PROMPT = "The quick brown fox"


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows, n, k, group", [(1, 48, 64, 32), (5, 40, 96, 16), (1, 4096, 4096, 128),
                                               (4, 11008, 4096, 128), (3, 33, 128, 64)])
def test_quantized_matmul_matches_the_reference(bits, rows, n, k, group):
    generator = torch.Generator().manual_seed(rows * n + k + bits)
    weight = quantize_weight(torch.randn(n, k, generator=generator), bits=bits, group_size=group)
    x = torch.randn(rows, k, generator=generator)
    expected = (x.double() @ weight.dequantize().double().T).float()  # (rows, n)
    on_gpu = dataclasses.replace(weight, codes=weight.codes.to(CUDA), scales=weight.scales.to(CUDA))
    got = tk.quantized_matmul(x.to(CUDA), on_gpu).cpu()
    scale = expected.abs().max().item()
    assert torch.allclose(got, expected, atol=2e-4 * scale, rtol=1e-3)


@pytest.mark.parametrize("kind", ["int8", "hierarchical"])
@pytest.mark.parametrize("dims", [16, 64, 128])
def test_quantize_on_append_writes_the_reference_codes(kind, dims):
    x = torch.randn(3, 5, dims, generator=torch.Generator().manual_seed(dims))
    got, expected = tk.quantize_vectors(x.to(CUDA), kind), quantize(x, kind)
    for plane, reference in zip(got.planes, expected.planes):
        assert torch.equal(plane.cpu(), reference)
    assert torch.equal(got.scale.cpu(), expected.scale)
    if kind == "hierarchical":
        assert torch.equal(got.low.cpu(), expected.low)


@pytest.mark.parametrize("kind, draft", [("int8", False), ("hierarchical", False), ("hierarchical", True)])
@pytest.mark.parametrize("heads, kv_heads, start, steps", [(4, 2, 36, 1), (6, 3, 60, 4), (32, 8, 3000, 5)])
def test_decode_attention_over_a_quantized_cache(kind, draft, heads, kv_heads, start, steps):
    generator = torch.Generator().manual_seed(heads + start)
    dims, max_len = 64, start + steps + 8
    keys = quantize(torch.randn(kv_heads, max_len, dims, generator=generator), kind)
    values = quantize(torch.randn(kv_heads, max_len, dims, generator=generator), kind)
    q = torch.randn(steps, heads, dims, generator=generator)
    group = heads // kv_heads
    k = dequantize(keys, draft=draft).repeat_interleave(group, 0)  # (H, S_max, D)
    v = dequantize(values, draft=draft).repeat_interleave(group, 0)
    on_gpu = [PackedVectors(p.kind, tuple(plane.to(CUDA) for plane in p.planes), p.scale.to(CUDA),
                            None if p.low is None else p.low.to(CUDA)) for p in (keys, values)]
    got = tk.quantized_decode_attention(q.to(CUDA), *on_gpu, start, draft=draft).cpu()  # (T, H, D)
    for t in range(steps):  # query t sees positions [0, start + t]
        seen = start + t + 1
        weights = torch.softmax((k[:, :seen] @ q[t][:, :, None])[..., 0] * dims ** -0.5, dim=-1)  # (H, S)
        expected = (weights[:, None, :] @ v[:, :seen])[:, 0]  # (H, D)
        assert torch.allclose(got[t], expected, atol=1e-4, rtol=1e-3)


@pytest.fixture(scope="module")
def target():
    path = builtin_model_path()
    if path is None:
        pytest.skip("this installation has no built-in model")
    return path


def test_the_gpu_computes_the_cpus_logits(target):
    cpu = Engine.load(target, max_context=128)
    gpu = Engine.load(target, max_context=128, device="cuda")
    ids = torch.tensor([cpu.tokenizer.encode(PROMPT)])
    cpu_logits = cpu.model.forward_logits(ids, 0, cpu.model.new_cache(128))[0, -1]  # (V,)
    gpu_logits = gpu.model.forward_logits(ids.to(CUDA), 0, gpu.model.new_cache(128))[0, -1].cpu()
    assert torch.allclose(cpu_logits, gpu_logits, atol=2e-3 * cpu_logits.abs().max().item())


@pytest.mark.parametrize("drafter", ["quantspec", "quantspec:8"])
def test_quantspec_on_the_gpu_equals_plain_decoding_on_the_gpu(target, drafter):
    plain = Engine.load(target, max_context=256, device="cuda", kv_cache="hierarchical")
    fast = Engine.load(target, max_context=256, device="cuda", drafter=drafter, draft_length=3)
    expected = greedy(plain)
    fast.reset()
    events = list(fast.generate(PROMPT, max_new_tokens=48, ignore_eos=True))
    assert [t for e in events for t in e.token_ids] == expected
    assert events[-1].stats.drafted > 0 and events[-1].stats.accepted > 0


@pytest.mark.parametrize("drafter", ["ngram", "skip:3", "early-exit:6"])
def test_other_drafters_on_the_gpu_equal_plain_decoding(target, drafter):
    plain = Engine.load(target, max_context=256, device="cuda")
    fast = Engine.load(target, max_context=256, device="cuda", drafter=drafter, draft_length=3)
    assert greedy(fast) == greedy(plain)


def test_offloaded_layers_on_the_gpu_compute_the_same_tokens(target):
    plain = Engine.load(target, max_context=256, device="cuda")
    offloaded = Engine.load(target, max_context=256, device="cuda", offload_layers=list(range(4, 12)))
    assert offloaded.model.streamer.host_bytes() > 0
    assert greedy(offloaded) == greedy(plain)
    for drafter in ("quantspec", "early-exit:3"):
        fast = Engine.load(target, max_context=256, device="cuda", offload_layers=list(range(4, 12)),
                           drafter=drafter, draft_length=3)
        expected = greedy(Engine.load(target, max_context=256, device="cuda", kv_cache="hierarchical")) \
            if drafter == "quantspec" else greedy(plain)
        assert greedy(fast) == expected, drafter


def test_sampling_on_the_gpu_is_reproducible_with_a_seed(target):
    engine = Engine.load(target, max_context=256, device="cuda", drafter="quantspec", draft_length=3)
    first = greedy(engine, temperature=0.8, seed=7)
    assert greedy(engine, temperature=0.8, seed=7) == first
