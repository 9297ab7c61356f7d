"""The static decode step (edge/model/static_step.py) and its Triton kernels (edge/kernels/step_kernels.py) on the
CPU: the kernels through Triton's interpreter against their torch references, and the step's logic (positions read
from a buffer, keys/values written in place, causal attention over the whole cache) against the model's own eager
forward. On a GPU the same step is captured in a CUDA graph; tests/kernels/test_gpu.py checks that there."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from edge.kernels import step_kernels as sk  # noqa: E402
from edge.kernels.quant import QuantizedLinear, quantize_weight  # noqa: E402
from edge.model import transformer  # noqa: E402
from edge.model.config import ModelConfig  # noqa: E402
from edge.model.quantized_kv_cache import QuantizedKVCache  # noqa: E402
from edge.model.static_step import StaticStep, StepGraphs, applies  # noqa: E402

CONFIG = ModelConfig(architecture="LlamaForCausalLM", vocab_size=96, hidden_size=64, intermediate_size=96,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position_embeddings=128, tie_word_embeddings=True)


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setenv("EDGE_TRITON_ON_CPU", "1")
    monkeypatch.setenv("EDGE_STATIC_STEP", "1")


@pytest.mark.parametrize("last_sums", [False, True])
@pytest.mark.parametrize("fmt, unpack", [("float16", 1), ("int8", 1), ("int8", 3), ("int8", 4), ("int4", 2),
                                         ("int4", 3), ("int4", 4)])
def test_the_step_matmul_matches_the_reference_and_each_row_is_computed_alone(on_cpu, monkeypatch, fmt, unpack,
                                                                              last_sums):
    monkeypatch.setattr(sk, "LAST_SUMS", last_sums)  # the partial sums added by the last split, or a kernel
    generator = torch.Generator().manual_seed(len(fmt))
    n, k = 40, 512
    dense = torch.randn(n, k, generator=generator) * 0.05
    weight = dense.half() if fmt == "float16" else quantize_weight(dense, 8 if fmt == "int8" else 4, 32)
    matrix = dense.half().double() if fmt == "float16" else weight.dequantize().double()
    splits = 3 if unpack == 4 else None  # (the word kernel splits only longer rows by default)
    if fmt != "float16" and unpack != 2:  # split along its inputs
        assert sk.linear_tiles(weight, torch.device("cpu"), unpack=unpack, splits=splits)[2] > 1
    x = torch.randn(3, 2 * k, generator=generator).half()
    residual = torch.randn(3, n, generator=generator).half()
    # (3, n): silu(x[:, :k]) * x[:, k:] @ W.T + residual
    got = sk.linear(x, weight, residual, glu=True, unpack=unpack, splits=splits)
    inputs = (torch.nn.functional.silu(x[:, :k].double()) * x[:, k:].double()).half().double()
    expected = inputs @ matrix.T + residual.double()
    assert (got.double() - expected).norm() / expected.norm() < 2e-3
    for row in (0, 2):
        assert torch.equal(sk.linear(x[row:row + 1], weight, residual[row:row + 1], glu=True, unpack=unpack,
                                     splits=splits)[0], got[row])


@pytest.mark.parametrize("fmt, unpack", [("float16", 1), ("int4", 3), ("int4", 4), ("int8", 4)])
def test_the_step_matmul_reads_rms_normed_rows(on_cpu, fmt, unpack):
    generator = torch.Generator().manual_seed(3)
    dense = torch.randn(24, 64, generator=generator) * 0.1
    weight = dense.half() if fmt == "float16" else quantize_weight(dense, 8 if fmt == "int8" else 4, 32)
    x = torch.randn(3, 64, generator=generator).half()
    norm_weight = (1 + 0.1 * torch.randn(64, generator=generator)).half()
    got = sk.linear(x, weight, norm=(norm_weight, 1e-5), unpack=unpack)
    normed = sk.rms_norm(x, norm_weight, 1e-5)  # the norm kernel's arithmetic, then the matmul
    assert torch.allclose(got.float(), sk.linear(normed, weight, unpack=unpack).float(), rtol=2e-3, atol=2e-3)
    assert torch.equal(sk.linear(x[2:], weight, norm=(norm_weight, 1e-5), unpack=unpack)[0], got[2])


@pytest.mark.parametrize("fmt, unpack", [("float16", 1), ("int8", 4), ("int4", 4), ("int4", 3)])
def test_the_step_matmul_writes_swiglu_of_gate_and_up_rows(on_cpu, fmt, unpack):
    generator = torch.Generator().manual_seed(11)
    dense = torch.randn(2 * 24, 128, generator=generator) * 0.1  # gate rows, then up rows
    weight = dense.half() if fmt == "float16" else quantize_weight(dense, 8 if fmt == "int8" else 4, 32)
    x = torch.randn(3, 128, generator=generator).half()
    norm_weight = (1 + 0.1 * torch.randn(128, generator=generator)).half()
    got = sk.linear(x, weight, norm=(norm_weight, 1e-5), unpack=unpack, glu_out=True)  # (3, 24)
    full = sk.linear(x, weight, norm=(norm_weight, 1e-5), unpack=unpack)  # (3, 48), rounded
    expected = (torch.nn.functional.silu(full[:, :24].float()) * full[:, 24:].float()).half()
    assert got.shape == (3, 24)
    assert torch.allclose(got.float(), expected.float(), rtol=2e-3, atol=2e-3)
    for row in range(3):
        assert torch.equal(sk.linear(x[row:row + 1], weight, norm=(norm_weight, 1e-5), unpack=unpack,
                                     glu_out=True)[0], got[row])


@pytest.mark.parametrize("bits, group", [(4, 32), (4, 128), (8, 16), (8, 64)])
def test_the_word_layout_holds_every_code_once_and_unpacks_to_them(bits, group):
    generator = torch.Generator().manual_seed(bits + group)
    weight = quantize_weight(torch.randn(6, 2 * group, generator=generator), bits, group)
    words = sk.step_codes(weight)  # (6, 2 group / (32 / bits)) int32, made once
    assert sk.step_codes(weight) is words and words.dtype == torch.int32
    per_word = 32 // bits
    count = group // per_word  # words a group
    unsigned = (words.long() & 0xFFFFFFFF)[..., None] >> (torch.arange(per_word) * bits) & ((1 << bits) - 1)
    codes = unsigned.view(6, 2, count, per_word).transpose(2, 3).reshape(6, -1) - (1 << (bits - 1))  # input order
    assert torch.equal(codes, weight.signed_codes().long())


def tiny_model() -> transformer.Transformer:
    torch.manual_seed(0)
    model = transformer.Transformer(CONFIG)
    for parameter in model.parameters():
        parameter.data.normal_(0.0, 0.2)
    return model.half().eval().requires_grad_(False)


def test_the_step_equals_its_torch_reference_and_a_verify_pass_equals_single_steps(on_cpu):
    model = tiny_model()
    cache = QuantizedKVCache.for_model(CONFIG, 64, key_format="hierarchical", value_format="hierarchical")
    assert applies(model, cache)
    graphs = StepGraphs(model, cache)
    reference = StaticStep(model, cache)
    reference.kernels = None  # the torch reference of every operation
    assert graphs.step.kernels is not None
    prompt = torch.tensor([[5, 17, 33, 2]])
    first = graphs.logits(prompt, 0).clone()  # (4, V)
    reference.tokens[:4], reference.position[0] = prompt[0], 0
    expected = reference.forward(4, None, False)
    assert (first.float() - expected.float()).norm() / expected.float().norm() < 1e-2
    # the eager model over a cache of its own (its attention and matmuls in torch) agrees closely
    eager = model.logits(model(prompt, 0, model.new_cache(64)))[0]
    assert (first.float() - eager.float()).norm() / eager.float().norm() < 2e-2
    # a verify pass of 2 rows gives each row exactly what single steps give it (and stores the same cache)
    feed = [int(first[-1].argmax()), 40]
    verify = graphs.logits(torch.tensor([feed]), 4).clone()
    for offset, token in enumerate(feed):
        single = graphs.logits(torch.tensor([[token]]), 4 + offset)
        assert torch.equal(single[0], verify[offset]), offset
    # the draft's view (upper 4 bits) over a subset of the layers: k greedy tokens fed back on the device are
    # what one-row steps and an argmax give
    drafted = graphs.draft_greedy(feed[0], 4, 2, layers=[0], draft=True)
    first_draft = int(graphs.logits(torch.tensor([[feed[0]]]), 4, layers=[0], draft=True)[0].argmax())
    second_draft = int(graphs.logits(torch.tensor([[first_draft]]), 5, layers=[0], draft=True)[0].argmax())
    assert drafted == [first_draft, second_draft]


def test_quantized_projections_and_an_int8_cache_run_on_the_step(on_cpu):
    model = tiny_model()
    for block in model.layers:  # QuantSpec's draft: QuantizedLinear projections
        block.ffn.w_down = QuantizedLinear.from_linear(block.ffn.w_down, bits=4, group_size=32)
    cache = QuantizedKVCache.for_model(CONFIG, 32, key_format="int8", value_format="int8")
    assert applies(model, cache)
    logits = StepGraphs(model, cache).logits(torch.tensor([[3, 4]]), 0)
    eager = model.logits(model(torch.tensor([[3, 4]]), 0, QuantizedKVCache.for_model(
        CONFIG, 32, key_format="int8", value_format="int8")))[0]
    assert (logits.float() - eager.float()).norm() / eager.float().norm() < 2e-2


def test_greedy_decoding_through_forward_logits_takes_the_step(on_cpu, monkeypatch):
    monkeypatch.setattr(transformer, "_STATIC_ON_CPU", True)
    model = tiny_model()
    cache = model.new_cache(32)  # a 16-bit cache
    logits = model.forward_logits(torch.tensor([[1, 2, 3]]), 0, cache)[0]
    assert cache.length == 3 and logits.shape == (3, CONFIG.vocab_size)
    assert model._static_steps[1] is not None  # the step ran it
    eager = model.logits(model(torch.tensor([[1, 2, 3]]), 0, model.new_cache(32)))[0]
    assert (logits.float() - eager.float()).norm() / eager.float().norm() < 2e-2
    monkeypatch.setenv("EDGE_STATIC_STEP", "0")
    assert not applies(model, cache)
