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


# ---- the static step (edge/model/static_step.py): its kernels, and decoding through its CUDA graphs --------------

@pytest.mark.parametrize("fmt, unpack", [("float16", 1), ("bfloat16", 1), ("int8", 0), ("int8", 1), ("int8", 2),
                                         ("int8", 3), ("int8", 4), ("int4", 0), ("int4", 1), ("int4", 2),
                                         ("int4", 3), ("int4", 4)])
@pytest.mark.parametrize("rows, n, k", [(1, 4096, 4096), (5, 256, 32768), (3, 33, 128), (16, 11008, 1024)])
@pytest.mark.parametrize("last_sums", [False, True])
def test_the_step_matmul_matches_the_reference_on_the_gpu(fmt, unpack, rows, n, k, last_sums, monkeypatch):
    from edge.kernels import step_kernels as sk

    monkeypatch.setattr(sk, "LAST_SUMS", last_sums)  # the partial sums added by the last split, or a kernel

    generator = torch.Generator(device=CUDA).manual_seed(rows * n + k)
    dense = torch.randn(n, k, generator=generator, device=CUDA) * 0.05
    dtype = torch.bfloat16 if fmt == "bfloat16" else torch.float16
    weight = dense.to(dtype) if fmt in ("float16", "bfloat16") else \
        quantize_weight(dense, 8 if fmt == "int8" else 4, 128 if k % 128 == 0 else 32)
    matrix = weight.double() if isinstance(weight, torch.Tensor) else weight.dequantize().double()
    x = torch.randn(rows, k, generator=generator, device=CUDA).to(dtype)
    residual = torch.randn(rows, n, generator=generator, device=CUDA).to(dtype)
    got = sk.linear(x, weight, residual, unpack=unpack)
    expected = x.double() @ matrix.T + residual.double()
    assert torch.isfinite(got).all()
    assert (got.double() - expected).norm() / expected.norm() < (1e-2 if fmt == "bfloat16" else 2e-3)
    for row in range(rows):  # each row alone: what keeps a verify pass exact
        assert torch.equal(sk.linear(x[row:row + 1], weight, residual[row:row + 1], unpack=unpack)[0], got[row])


@pytest.mark.parametrize("fmt, unpack", [("float16", 1), ("int8", 1), ("int8", 4), ("int4", 4), ("int4", 3)])
@pytest.mark.parametrize("rows, n, k", [(1, 4096, 256), (4, 216320, 256), (3, 2 * 1408, 2048)])
def test_the_step_matmul_writes_swiglu_on_the_gpu(fmt, unpack, rows, n, k):
    from edge.kernels import step_kernels as sk

    generator = torch.Generator(device=CUDA).manual_seed(rows + n + k)
    dense = torch.randn(n, k, generator=generator, device=CUDA) * 0.05  # gate rows, then up rows
    weight = dense.half() if fmt == "float16" else quantize_weight(dense, 8 if fmt == "int8" else 4, 32)
    matrix = weight.double() if isinstance(weight, torch.Tensor) else weight.dequantize().double()
    x = torch.randn(rows, k, generator=generator, device=CUDA).half()
    got = sk.linear(x, weight, unpack=unpack, glu_out=True)  # (rows, n / 2)
    products = x.double() @ matrix.T
    gate, up = products[:, :n // 2], products[:, n // 2:]
    expected = gate * torch.sigmoid(gate) * up
    assert torch.isfinite(got).all() and got.shape == (rows, n // 2)
    assert (got.double() - expected).norm() / expected.norm() < 3e-3
    for row in range(rows):
        assert torch.equal(sk.linear(x[row:row + 1], weight, unpack=unpack, glu_out=True)[0], got[row])


@pytest.mark.parametrize("fmt, unpack", [("float16", 1), ("int8", 3), ("int4", 3), ("int4", 1), ("int8", 4),
                                         ("int4", 4)])
def test_the_step_matmul_reads_rms_normed_rows_on_the_gpu(fmt, unpack):
    from edge.kernels import step_kernels as sk

    generator = torch.Generator(device=CUDA).manual_seed(5)
    dense = torch.randn(4096, 512, generator=generator, device=CUDA) * 0.05
    weight = dense.half() if fmt == "float16" else quantize_weight(dense, 8 if fmt == "int8" else 4, 32)
    x = torch.randn(5, 512, generator=generator, device=CUDA).half()
    norm_weight = (1 + 0.1 * torch.randn(512, generator=generator, device=CUDA)).half()
    got = sk.linear(x, weight, norm=(norm_weight, 1e-5), unpack=unpack)
    expected = sk.linear(sk.rms_norm(x, norm_weight, 1e-5), weight, unpack=unpack)
    assert (got.float() - expected.float()).norm() / expected.float().norm() < 2e-3
    for row in range(5):
        assert torch.equal(sk.linear(x[row:row + 1], weight, norm=(norm_weight, 1e-5), unpack=unpack)[0], got[row])


@pytest.mark.parametrize("kind", ["float16", "int8", "hierarchical", "draft"])
@pytest.mark.parametrize("heads, kv_heads, dims, start, steps", [(4, 2, 64, 36, 1), (32, 8, 128, 3000, 5),
                                                                 (8, 1, 64, 700, 4)])
def test_the_step_attention_matches_the_reference_on_the_gpu(kind, heads, kv_heads, dims, start, steps):
    from edge.kernels import step_kernels as sk

    generator = torch.Generator().manual_seed(heads + start)
    max_len = start + steps + 40
    raw_k, raw_v = (torch.randn(kv_heads, max_len, dims, generator=generator) for _ in range(2))
    if kind == "float16":
        k, v = raw_k.half().float(), raw_v.half().float()
        keys, values = ((t.half().to(CUDA),) * 4 for t in (raw_k, raw_v))
        code = sk.FLOAT_CACHE
    else:
        fmt = "int8" if kind == "int8" else "hierarchical"
        packed = [quantize(t, fmt) for t in (raw_k, raw_v)]
        k, v = (dequantize(p, draft=kind == "draft") for p in packed)
        keys, values = ((p.planes[0].to(CUDA), p.planes[-1].to(CUDA), p.scale.to(CUDA),
                         (p.low if p.low is not None else p.scale).to(CUDA)) for p in packed)
        code = {"int8": sk.INT8_CACHE, "hierarchical": sk.HIERARCHICAL, "draft": sk.HIERARCHICAL_DRAFT}[kind]
    q = torch.randn(steps, heads * dims, generator=generator)
    position = torch.tensor([start], dtype=torch.int32, device=CUDA)
    got = sk.attend(q.half().to(CUDA), keys, values, position, heads, kv_heads, dims, code, torch.float32).cpu()
    group = heads // kv_heads
    for t in range(steps):
        seen = start + t + 1
        kk, vv = k[:, :seen].repeat_interleave(group, 0), v[:, :seen].repeat_interleave(group, 0)  # (H, S, D)
        query = q[t].half().float().view(heads, dims)
        weights = torch.softmax((kk @ query[:, :, None])[..., 0] * dims ** -0.5, dim=-1)  # (H, S)
        expected = (weights[:, None, :] @ vv)[:, 0].reshape(-1)
        assert (got[t] - expected).norm() / expected.norm() < 3e-3, t  # float16 operands, float32 sums
    one = sk.attend(q[:1].half().to(CUDA), keys, values, position, heads, kv_heads, dims, code, torch.float32).cpu()
    assert torch.equal(one[0], got[0])


@pytest.mark.parametrize("kv_cache", [None, "hierarchical"])
def test_the_graph_step_replays_what_single_steps_compute(target, kv_cache):
    from edge.model.static_step import static_steps

    engine = Engine.load(target, max_context=256, device="cuda", dtype="float16", kv_cache=kv_cache)
    model, cache = engine.model, engine.cache
    steps = static_steps(model, cache)
    assert steps is not None and steps.capture
    prompt = torch.tensor([engine.tokenizer.encode(PROMPT * 8)], device=CUDA)  # longer than a step: eager
    model.forward_logits(prompt, 0, cache)
    start = prompt.shape[1]
    feed = torch.tensor([[5, 17, 33, 2]], device=CUDA)
    verify = model.forward_logits(feed, start, cache)[0]
    singles = torch.cat([model.forward_logits(feed[:, i:i + 1], start + i, cache)[0] for i in range(4)])
    assert torch.equal(verify, singles)
    assert len(steps.graphs) == 2  # one graph of 4 rows, one of 1 row, each replayed
    eager = Engine.load(target, max_context=256, device="cuda", dtype="float16", kv_cache=kv_cache)
    eager.model._static_steps = (eager.cache, None)  # the eager path on the same weights
    eager.model.forward_logits(prompt, 0, eager.cache)
    expected = eager.model.forward_logits(feed, start, eager.cache)[0]
    assert (verify.float() - expected.float()).norm() / expected.float().norm() < 1e-2


@pytest.mark.parametrize("drafter", ["quantspec", "quantspec:8", "skip:3", "early-exit:6"])
def test_speculation_through_the_graph_step_equals_plain_decoding(target, drafter):
    kv_cache = "hierarchical" if drafter.startswith("quantspec") else None
    plain = Engine.load(target, max_context=256, device="cuda", dtype="float16", kv_cache=kv_cache)
    expected = greedy(plain, max_new_tokens=64)
    assert plain.model._static_steps[1] is not None
    for length in (3, "adaptive"):
        fast = Engine.load(target, max_context=256, device="cuda", dtype="float16", kv_cache=kv_cache,
                           drafter=drafter, draft_length=length)
        fast.reset()
        events = list(fast.generate(PROMPT, max_new_tokens=64, ignore_eos=True))
        assert [t for e in events for t in e.token_ids] == expected, (drafter, length)
        assert events[-1].stats.drafted > 0
