"""int8 and int4 weights on the CPU (edge/model/packed_weights.py): on every kernel path the int8 kernel computes
exactly the integer arithmetic it promises (the same bits on every path), each row alone (so speculation on a quantized
model is exactly its own plain decoding), any matrix shape packs; edge's int4 quantizer (4-bit blocks of 32 with a
searched scale and minimum, run by the block kernel: test_block_formats.py) beats plain min/max blocks; a quantized
model stays close to the float one."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import kernel_for, kernel_path_names
from edge import EdgeError, Engine
from edge.errors import UnsupportedModelError
from edge.model.kernel_glue import ModelTensors
from edge.model.kv_cache import KVCache
from edge.sources.loading import load_model
from edge.model.block_weights import BlockLinear
from edge.model.packed_weights import PackedLinear, packed_format, quantize_weights
from edge.model.transformer import held_bytes
from edge.kernels.block_formats import BlockMatrix
from edge.kernels.cpu_kernel import CpuKernel
from edge.kernels.cpu_packing import int8_packed_size, pack_int8, unpack_int8

pytestmark = pytest.mark.skipif(CpuKernel.load() is None, reason="no C compiler: packed weights need the kernel")
FORMATS = ["int8", "int4"]
MODEL_FORMAT = {"int8": "int8", "int4": "blocks"}  # the model's packed_format() after --weights

def quantize_rows(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's activation quantization in torch: blocks of `block` values (zero padding to a whole block)
    scaled by 127 / max|x| and rounded half to even -> codes (M, K') int64 and scales (M, K'/block)."""
    rows, columns = x.shape
    padded = torch.zeros(rows, -(-columns // block) * block)
    padded[:, :columns] = x
    blocks = padded.view(rows, -1, block)  # (M, B, block)
    top = blocks.abs().amax(dim=2)  # (M, B)
    inverse = torch.where(top > 0, torch.tensor(127.0) / top, torch.zeros_like(top))
    codes = torch.round(blocks * inverse[..., None]).clamp(-127, 127).to(torch.int64)
    return codes.view(rows, -1), top / 127.0


def reference(x: torch.Tensor, packed: torch.Tensor, rows: int, columns: int,
              bias: torch.Tensor | None) -> torch.Tensor:
    """What the int8 kernel computes, in torch: each row quantized alone, an exact integer dot product with the
    codes, then (dot * weight scale) * row scale + bias, in float32."""
    codes, scales = unpack_int8(packed, rows, columns)  # (N, K) int8, (N,)
    quantized, row_scales = quantize_rows(x, columns)  # (M, K), (M, 1)
    dots = (quantized @ codes.to(torch.int64).T).to(torch.float32)  # (M, N), exact integers
    out = (dots * scales[None, :]) * row_scales
    return out + bias if bias is not None else out


@pytest.mark.parametrize("shape", [(16, 4), (64, 96), (272, 200), (1536, 256), (37, 83), (172, 172)])  # (N, K)
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_int8_kernel_computes_the_quantized_product_exactly(kernel, shape, with_bias):
    """Every shape packs (37 x 83, 172 x 172: padded with zero weights), and the kernel's result is the reference's,
    bit for bit."""
    generator = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(*shape, generator=generator) * 0.05  # (N, K)
    bias = torch.randn(shape[0], generator=generator) if with_bias else None
    x = torch.randn(7, shape[1], generator=generator)  # (M, K)
    x[3] = 0.0  # an all-zero row has scale 0
    packed = pack_int8(weight)
    assert packed.numel() == int8_packed_size(*shape)
    out = kernel.quantized(x, packed, "int8", shape[0], bias)  # (M, N)
    assert torch.equal(out, reference(x, packed, *shape, bias))
    exact = x @ weight.T + (bias if bias is not None else 0.0)
    assert (out - exact).abs().max() < 0.02 * exact.abs().max()


def test_int4_codes_stand_for_the_weights_better_than_min_max_blocks():
    """edge's int4 quantizer searches each block's scale and minimum: its squared error is below that of the same
    layout quantized from the block's range alone (the gguf package's Q4_1), and every weight lies within a step of
    its value."""
    from gguf import GGMLQuantizationType, quants

    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(48, 96, generator=generator) * torch.exp(torch.randn(48, 96, generator=generator))
    restored = BlockMatrix.quantized("q4_1", weight).dequantized()  # (48, 96)
    min_max = torch.from_numpy(quants.dequantize(quants.quantize(weight.numpy(), GGMLQuantizationType.Q4_1),
                                                 GGMLQuantizationType.Q4_1))
    assert ((restored - weight) ** 2).sum() < 0.95 * ((min_max - weight) ** 2).sum()
    blocks = weight.view(48, 3, 32)
    step = ((blocks.amax(dim=2) - blocks.amin(dim=2)) / 15).repeat_interleave(32, dim=1)  # (48, 96)
    assert ((restored - weight).abs() <= step * 1.01 + 1e-6).all()


def test_int8_rows_are_batch_and_thread_invariant(kernel):
    generator = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(336, 200, generator=generator), torch.randn(336, generator=generator)
    packed = pack_int8(weight)
    x = torch.randn(13, 200, generator=generator)
    one = kernel.with_threads(1)
    single = torch.cat([one.quantized(x[i:i + 1], packed, "int8", 336, bias) for i in range(13)])  # (13, N)
    for rows in range(1, 14):
        assert torch.equal(kernel.quantized(x[:rows], packed, "int8", 336, bias), single[:rows]), rows
    assert torch.equal(kernel.with_threads(2).quantized(x, packed, "int8", 336, bias), single)


def test_every_path_computes_the_same_int8_bits():
    """Integer sums and one shared scalar epilogue: the avx512 (VNNI), avx2, neon and portable code agree exactly."""
    generator = torch.Generator().manual_seed(8)
    weight, bias = torch.randn(160, 136, generator=generator), torch.randn(160, generator=generator)
    packed, x = pack_int8(weight), torch.randn(5, 136, generator=generator)
    outputs = {name: kernel_for(name).quantized(x, packed, "int8", 160, bias) for name in kernel_path_names()}
    first = next(iter(outputs.values()))
    assert all(torch.equal(out, first) for out in outputs.values()), list(outputs)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", ["llama3", "qwen3", "mistral", "llama_bias_linear_rope"])
def test_a_quantized_verify_pass_reproduces_its_decode_steps_and_stays_close_to_float(checkpoint_factory, family,
                                                                                       fmt):
    path = checkpoint_factory(family)
    model, reference_model = load_model(path), load_model(path)
    quantize_weights(model, fmt)
    assert model.packed_head is not None  # logits through the kernel too
    assert isinstance(model.layers[0].attn.wqkv, PackedLinear if fmt == "int8" else BlockLinear)
    assert model.runner.fuses(ModelTensors(model), 40, torch.float32, model.new_cache(8))
    tokens = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    cache = KVCache.for_model(model.config, 128, dtype=torch.float32, device=torch.device("cpu"))
    with torch.inference_mode():
        prompt = model.logits(model(tokens[:, :30], 0, cache))[0]  # (30, V): a prompt runs in the kernel too
        verify = model.logits(model(tokens[:, 30:36], 30, cache))[0]  # (6, V)
        cache.rollback(30)
        steps = torch.cat([model.logits(model(tokens[:, i:i + 1], i, cache))[0] for i in range(30, 36)])
        exact = reference_model.logits(reference_model(tokens[:, :30], 0, reference_model.new_cache(128)))[0]
    assert torch.equal(verify, steps)
    # relative error of the logits: about 4% at int8 and 30% at int4 on these tiny random models (3 layers of 64 with
    # Gaussian weights, 4 bits' worst case; docs/benchmarks.md measures trained models)
    assert (prompt - exact).norm() < (0.1 if fmt == "int8" else 0.4) * exact.norm()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("drafter", ["ngram", "early-exit:1", "adaptive", "skip:1"])
def test_greedy_speculation_on_quantized_weights_equals_their_plain_decoding(llama_dir, drafter, fmt):
    prompts = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "import os\nfor name in os"]
    plain = Engine.load(llama_dir, max_context=512, weights=fmt)
    fast = Engine.load(llama_dir, max_context=512, weights=fmt, drafter=drafter)
    accepted = 0
    for prompt in prompts:
        expected = [t for e in plain.generate(prompt, max_new_tokens=120, temperature=0.0, ignore_eos=True) for t in e.token_ids]
        events = list(fast.generate(prompt, max_new_tokens=120, temperature=0.0, ignore_eos=True))
        assert [t for e in events for t in e.token_ids] == expected, (drafter, prompt)
        accepted += events[-1].stats.accepted
    assert accepted > 0  # it did speculate


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_weights_run_beside_a_quantized_kv_cache(llama_dir, fmt):
    """A quantized KV cache takes the unfused path (per-module calls): packed layers run there too, still lossless."""
    plain = Engine.load(llama_dir, max_context=256, weights=fmt, kv_cache="int8")
    fast = Engine.load(llama_dir, max_context=256, weights=fmt, kv_cache="int8", drafter="early-exit:1")
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    expected = [t for e in plain.generate(prompt, max_new_tokens=60, temperature=0.0, ignore_eos=True) for t in e.token_ids]
    assert [t for e in fast.generate(prompt, max_new_tokens=60, temperature=0.0, ignore_eos=True) for t in e.token_ids] == expected


def test_int8_quarters_and_int4_divides_by_six_the_layers_memory(checkpoint_factory):
    """int8: 8 bits and a scale per output; int4: 5 bits a weight (4-bit codes, a float16 scale and minimum per 32),
    with a copy of the head in 8-bit blocks; the embedding stays as loaded."""
    path = checkpoint_factory("smollm")  # 64 wide: whole int4 blocks, as real models have; tied embeddings
    stored = load_model(path)
    layers = sum(t.nbytes for t in stored.layers.state_dict().values())
    sizes, wholes = {}, {}
    for fmt in FORMATS:
        model = load_model(path)
        quantize_weights(model, fmt)
        sizes[fmt], wholes[fmt] = held_bytes([model.layers]), model.weight_bytes()
    assert sizes["int8"] < 0.3 * layers and sizes["int4"] < 0.2 * layers  # float32 -> int8 -> int4
    head = stored.config.vocab_size * stored.config.hidden_size
    assert model.packed_head.formats == ["q8_0"] and model.packed_head.nbytes < head * 8.6 / 8
    assert wholes["int4"] == stored.weight_bytes() - layers + sizes["int4"] + model.packed_head.nbytes


def test_bad_weight_requests_are_one_line_errors(llama_dir, checkpoint_factory):
    with pytest.raises(EdgeError, match="choose one of int8, int4, float16"):
        Engine.load(llama_dir, weights="int2")
    with pytest.raises(UnsupportedModelError, match="float32"):
        Engine.load(llama_dir, weights="int4", dtype="bfloat16")
    with pytest.raises(EdgeError, match="torch backend"):
        Engine.load(llama_dir, weights="int4", offload_layers=[0])
    model = load_model(checkpoint_factory("llama3"))
    quantize_weights(model, "int8")
    with pytest.raises(UnsupportedModelError, match="already int8; load it again"):
        quantize_weights(model, "int4")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quantized_draft_model_keeps_the_float_target_lossless(checkpoint_factory, tmp_path_factory, tokenizer_dir,
                                                                  fmt):
    from tests.conftest import build_checkpoint

    target = checkpoint_factory("llama3")
    small = build_checkpoint(tmp_path_factory.mktemp(f"{fmt}-drafter"), "llama3", tokenizer_dir, seed=5,
                             num_hidden_layers=1)
    plain = Engine.load(target, max_context=512)
    fast = Engine.load(target, max_context=512, drafter=f"draft:{small}", draft_weights=fmt)
    assert packed_format(fast.drafter.model) == MODEL_FORMAT[fmt] and not packed_format(fast.model)
    for prompt in ["The quick brown fox jumps over the lazy dog. The quick", "import os\nfor name in os"]:
        expected = [t for e in plain.generate(prompt, max_new_tokens=100, temperature=0.0, ignore_eos=True) for t in e.token_ids]
        assert [t for e in fast.generate(prompt, max_new_tokens=100, temperature=0.0, ignore_eos=True) for t in e.token_ids] == expected


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_speculative_sampling_on_quantized_weights_keeps_their_distribution(checkpoint_factory, tmp_path_factory,
                                                                            tokenizer_dir, fmt):
    """Sampled speculation with an int8/int4 target and an int8/int4 draft model: the first three tokens' joint
    distribution is the target's own (top-2 at temperature 1: 8 outcomes), by a chi-square test over 3000 replies."""
    from tests.conftest import build_checkpoint
    from edge.decoding.sampling import SamplingParams, distribution

    target = checkpoint_factory("llama3")
    small = build_checkpoint(tmp_path_factory.mktemp(f"{fmt}-sampling-drafter"), "llama3", tokenizer_dir, seed=7,
                             num_hidden_layers=1)
    plain = Engine.load(target, max_context=64, weights=fmt)
    fast = Engine.load(target, max_context=64, weights=fmt, drafter=f"draft:{small}", draft_weights=fmt,
                       draft_length=2)
    prompt = plain.tokenizer.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, top_k=2)
    none = torch.empty(0, dtype=torch.long)

    def next_token_probs(ids: list[int]) -> torch.Tensor:  # (V,): the target's sampling distribution after ids
        with torch.inference_mode():
            logits = plain.model.forward_logits(torch.tensor([ids]), 0, plain.model.new_cache(64))[0, -1].float()
        return distribution(logits[None], params, none)[0]

    expected: dict[tuple[int, ...], float] = {}
    first = next_token_probs(prompt)
    for a in first.nonzero().flatten().tolist():
        second = next_token_probs(prompt + [a])
        for b in second.nonzero().flatten().tolist():
            third = next_token_probs(prompt + [a, b])
            for c in third.nonzero().flatten().tolist():
                expected[(a, b, c)] = float(first[a] * second[b] * third[c])
    samples, counts = 3000, {}
    for seed in range(samples):
        ids = [t for e in fast.generate(prompt, max_new_tokens=3, temperature=1.0, top_k=2, repetition_penalty=1.0,
                                        seed=seed, ignore_eos=True) for t in e.token_ids]
        counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
    assert set(counts) <= set(expected) and len(expected) == 8
    statistic = sum((counts.get(key, 0) - p * samples) ** 2 / (p * samples) for key, p in expected.items())
    degrees = torch.tensor((len(expected) - 1) / 2, dtype=torch.float64)
    p_value = float(torch.special.gammaincc(degrees, torch.tensor(statistic / 2, dtype=torch.float64)))
    assert p_value > 1e-3, (counts, expected)
    assert packed_format(fast.drafter.model) == MODEL_FORMAT[fmt]  # the draft model is quantized like the target
