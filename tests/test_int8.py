"""int8 weights on the CPU (edge/int8.py): the kernel computes exactly the integer arithmetic it promises, each row
alone (so speculation on the int8 model is exactly its own plain decoding), and the int8 model stays close to the
float one."""

from __future__ import annotations

import pytest
import torch

from edge import EdgeError, Engine
from edge.errors import UnsupportedModelError
from edge.int8 import Int8Linear, quantize_int8
from edge.kv_cache import KVCache
from edge.loading import load_model
from kernels.cpu_matmul import RowwiseMatmul, pack_int8, unpack_int8

matmul = RowwiseMatmul.load()
pytestmark = pytest.mark.skipif(matmul is None, reason="no C compiler: int8 weights need edge's kernel")


def reference_int8(x: torch.Tensor, packed: torch.Tensor, rows: int, columns: int,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """What rowwise_matmul_i8 computes, in torch: each row quantized alone (round half to even), an exact integer
    dot product with the codes, then (dot * weight scale) * row scale + bias in float32."""
    codes, scales = unpack_int8(packed, rows, columns)  # (N, K) int8, (N,)
    top = x.abs().amax(dim=1)  # (M,)
    inverse = torch.where(top > 0, torch.tensor(127.0) / top, torch.zeros_like(top))
    quantized = torch.round(x * inverse[:, None]).clamp(-127, 127).to(torch.int64)  # (M, K)
    dots = (quantized @ codes.to(torch.int64).T).to(torch.float32)  # (M, N), exact integers
    out = (dots * scales[None, :]) * (top / 127.0)[:, None]
    return out + (bias if bias is not None else 0.0)


@pytest.mark.parametrize("shape", [(16, 4), (64, 96), (272, 200), (1536, 256)])  # (N, K)
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_int8_kernel_computes_the_quantized_product_exactly(shape, with_bias):
    generator = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(*shape, generator=generator) * 0.05  # (N, K)
    bias = torch.randn(shape[0], generator=generator) if with_bias else None
    x = torch.randn(7, shape[1], generator=generator)  # (M, K)
    x[3] = 0.0  # an all-zero row has scale 0
    packed = pack_int8(weight)
    assert packed.numel() == shape[0] * shape[1] + 8 * shape[0]
    out = matmul.int8(x, packed, shape[0], bias)  # (M, N)
    assert torch.equal(out, reference_int8(x, packed, *shape, bias))
    codes, scales = unpack_int8(packed, *shape)
    assert (codes.float() * scales[:, None] - weight).abs().max() <= weight.abs().amax(dim=1).max() / 254 + 1e-6
    exact = x @ weight.T + (bias if bias is not None else 0.0)
    assert (out - exact).abs().max() < 0.05 * exact.abs().max()  # w8a8 is close to the float product


def test_int8_rows_are_batch_and_thread_invariant():
    generator = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(336, 200, generator=generator), torch.randn(336, generator=generator)
    packed = pack_int8(weight)
    x = torch.randn(13, 200, generator=generator)
    single = torch.cat([matmul.int8(x[i:i + 1], packed, 336, bias) for i in range(13)])  # (13, N)
    for rows in range(1, 14):
        assert torch.equal(matmul.int8(x[:rows], packed, 336, bias), single[:rows]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(matmul.int8(x, packed, 336, bias), single)
    finally:
        torch.set_num_threads(threads)


def test_packing_refuses_sizes_the_kernel_cannot_take():
    with pytest.raises(ValueError, match="multiple|% 16"):
        pack_int8(torch.randn(24, 8))


@pytest.mark.parametrize("family", ["llama3", "qwen3", "mistral", "llama_bias_linear_rope"])
def test_an_int8_verify_pass_reproduces_its_decode_steps_and_stays_close_to_float(checkpoint_factory, family):
    path = checkpoint_factory(family)
    model, reference = load_model(path), load_model(path)
    quantize_int8(model)
    assert model.int8_head is not None  # logits through the int8 kernel too
    assert isinstance(model.layers[0].attn.wqkv, Int8Linear) and model._can_fuse(1, 40, torch.float32,
                                                                                   model.new_cache(8))
    tokens = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    cache = KVCache.for_model(model.config, 128, dtype=torch.float32, device=torch.device("cpu"))
    with torch.inference_mode():
        prompt = model.logits(model(tokens[:, :30], 0, cache))[0]  # (30, V): a prompt runs in the kernel too
        verify = model.logits(model(tokens[:, 30:36], 30, cache))[0]  # (6, V)
        cache.rollback(30)
        steps = torch.cat([model.logits(model(tokens[:, i:i + 1], i, cache))[0] for i in range(30, 36)])
        exact = reference.logits(reference(tokens[:, :30], 0, reference.new_cache(128)))[0]  # (30, V)
    assert torch.equal(verify, steps)
    assert (prompt - exact).abs().max() < 0.1 * exact.abs().max()


@pytest.mark.parametrize("drafter", ["ngram", "early-exit:1", "adaptive", "skip:1"])
def test_greedy_speculation_on_int8_weights_equals_int8_plain_decoding(llama_dir, drafter):
    prompts = ["The quick brown fox jumps over the lazy dog. The quick brown fox", "import os\nfor name in os"]
    plain = Engine.load(llama_dir, max_context=512, weights="int8")
    fast = Engine.load(llama_dir, max_context=512, weights="int8", drafter=drafter)
    for prompt in prompts:
        expected = [t for e in plain.generate(prompt, max_new_tokens=120, ignore_eos=True) for t in e.token_ids]
        events = list(fast.generate(prompt, max_new_tokens=120, ignore_eos=True))
        assert [t for e in events for t in e.token_ids] == expected, (drafter, prompt)
    assert events[-1].stats.steps < 120  # it did speculate


def test_int8_weights_run_beside_a_quantized_kv_cache(llama_dir):
    """A quantized KV cache takes the unfused path (per-module calls): int8 layers run there too, still lossless."""
    plain = Engine.load(llama_dir, max_context=256, weights="int8", kv_cache="int8")
    fast = Engine.load(llama_dir, max_context=256, weights="int8", kv_cache="int8", drafter="early-exit:1")
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    expected = [t for e in plain.generate(prompt, max_new_tokens=60, ignore_eos=True) for t in e.token_ids]
    assert [t for e in fast.generate(prompt, max_new_tokens=60, ignore_eos=True) for t in e.token_ids] == expected


def test_int8_weights_halve_the_layers_memory(llama_dir):
    stored, quantized = load_model(llama_dir), load_model(llama_dir)
    quantize_int8(quantized)
    layers = sum(t.nbytes for t in stored.layers.state_dict().values())
    assert sum(t.nbytes for t in quantized.layers.state_dict().values()) < 0.3 * layers  # float32 -> int8


def test_bad_int8_requests_are_one_line_errors(llama_dir, checkpoint_factory):
    with pytest.raises(EdgeError, match="only load-time quantization is 'int8'"):
        Engine.load(llama_dir, weights="int4")
    with pytest.raises(UnsupportedModelError, match="float32"):
        Engine.load(llama_dir, weights="int8", dtype="bfloat16")
    with pytest.raises(EdgeError, match="torch backend"):
        Engine.load(llama_dir, weights="int8", offload_layers=[0])
    odd = load_model(checkpoint_factory("llama3"))
    odd.layers[0].ffn.w_down = torch.nn.Linear(127, 64, bias=False)  # 127 inputs: not a multiple of 4
    odd.layers[0].ffn.w_down.weight.requires_grad_(False)
    with pytest.raises(UnsupportedModelError, match=r"divisible by 16 \(outputs\) and 4 \(inputs\)"):
        quantize_int8(odd)


def test_an_int8_draft_model_keeps_the_float_target_lossless(checkpoint_factory, tmp_path_factory, tokenizer_dir):
    from conftest import build_checkpoint

    target = checkpoint_factory("llama3")
    small = build_checkpoint(tmp_path_factory.mktemp("int8-drafter"), "llama3", tokenizer_dir, seed=5,
                             num_hidden_layers=1)
    plain = Engine.load(target, max_context=512)
    fast = Engine.load(target, max_context=512, drafter=f"draft:{small}", draft_weights="int8")
    assert fast.drafter.model.int8 and not fast.model.int8
    for prompt in ["The quick brown fox jumps over the lazy dog. The quick", "import os\nfor name in os"]:
        expected = [t for e in plain.generate(prompt, max_new_tokens=100, ignore_eos=True) for t in e.token_ids]
        assert [t for e in fast.generate(prompt, max_new_tokens=100, ignore_eos=True) for t in e.token_ids] == expected


def test_without_avx512_the_scalar_loop_computes_the_same_integers(tmp_path):
    """CPUs without AVX-512 VNNI run the int8 kernel's portable loop: the same codes, sums and float steps, so the
    same bits as the vector path on this machine."""
    import ctypes
    import shutil
    import subprocess

    from kernels.cpu_matmul import FLAGS, SOURCE

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    library = tmp_path / "portable.so"
    subprocess.run([compiler, *FLAGS, "-mno-avx512f", str(SOURCE), "-o", str(library)], check=True, timeout=300)
    portable = RowwiseMatmul(ctypes.CDLL(str(library)))
    generator = torch.Generator().manual_seed(9)
    weight, bias = torch.randn(80, 52, generator=generator), torch.randn(80, generator=generator)
    x = torch.randn(6, 52, generator=generator)
    packed = pack_int8(weight)
    assert torch.equal(portable.int8(x, packed, 80, bias), matmul.int8(x, packed, 80, bias))
