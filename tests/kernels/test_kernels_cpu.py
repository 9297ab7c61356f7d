"""The batch-invariant CPU kernel on every path this machine runs (and the avx512 code under SIMDe emulation): close to
torch's results, and bit-identical for a row whatever else is in the batch — the property that makes greedy
speculative decoding exactly equal to plain decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edge.model.kernel_glue import draft_greedy, kernel_head, use_kernel
from edge.model.kv_cache import KVCache
from edge.sources.loading import load_model
from edge.kernels import cpu_paths
from edge.kernels.cpu_kernel import CpuKernel
from edge.kernels.records import DraftRequest
from tests.conftest import kernel_for, kernel_path_names

pytestmark = pytest.mark.skipif(CpuKernel.load() is None, reason="no C compiler: the kernel falls back to torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(96, 64), (37, 83), (512, 256)])  # (N, K); 83: a K that is not a lane multiple
def test_matmul_matches_torch(kernel, dtype, shape):
    generator = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(*shape, generator=generator).to(dtype)  # (N, K)
    bias = torch.randn(shape[0], generator=generator)
    x = torch.randn(3, 5, shape[1], generator=generator)  # (..., K)
    expected = F.linear(x, weight.float(), bias)
    torch.testing.assert_close(kernel(x, weight, bias), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(kernel(x, weight), F.linear(x, weight.float()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_rows_are_batch_and_thread_invariant(kernel, dtype):
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(300, 203, generator=generator).to(dtype)  # 300 outputs: a partial panel of 8 at the end
    x = torch.randn(9, 203, generator=generator)
    single = torch.cat([kernel.with_threads(1)(x[i:i + 1], weight) for i in range(9)])  # (9, N), a row per call
    for rows in range(1, 10):
        assert torch.equal(kernel(x[:rows], weight), single[:rows]), f"{rows} rows differ from 1-row calls"
    assert torch.equal(kernel.with_threads(2)(x, weight), single)


def test_torch_matmul_is_not_batch_invariant_which_is_why_the_kernel_exists():
    generator = torch.Generator().manual_seed(2)
    weight, x = torch.randn(1536, 256, generator=generator), torch.randn(5, 256, generator=generator)
    single = torch.cat([F.linear(x[i:i + 1], weight) for i in range(5)])
    assert not torch.equal(F.linear(x, weight), single)  # if torch ever becomes invariant, this test says so


@pytest.mark.parametrize("window", [None, 7, 40])
@pytest.mark.parametrize("kv_heads, dim, start", [(2, 40, 20), (2, 64, 53), (1, 32, 70), (4, 16, 3), (2, 24, 9)])
def test_attention_matches_sdpa_and_is_batch_invariant(kernel, window, kv_heads, dim, start):
    """Dims that are and are not multiples of every path's lane count, contexts with and without whole blocks of
    keys, GQA, MQA and MHA."""
    generator = torch.Generator().manual_seed(3)
    heads, steps, capacity = 4, 5, 96
    keys = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    q = torch.randn(1, heads, steps, dim, generator=generator)
    out = kernel.attention(q, keys[:, :, : start + steps], values[:, :, : start + steps], start, window)
    query_pos = torch.arange(start, start + steps)[:, None]
    key_pos = torch.arange(start + steps)[None, :]
    allowed = key_pos <= query_pos
    if window:
        allowed &= key_pos > query_pos - window
    expected = F.scaled_dot_product_attention(q, keys[:, :, : start + steps], values[:, :, : start + steps],
                                              attn_mask=allowed, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    one = kernel.with_threads(1)  # one query at a time and on one thread: the queries are split differently
    single = torch.cat([one.attention(q[:, :, t:t + 1], keys[:, :, : start + t + 1], values[:, :, : start + t + 1],
                                      start + t, window) for t in range(steps)], dim=2)
    assert torch.equal(out, single)


def test_rms_norm_matches_torch(kernel):
    generator = torch.Generator().manual_seed(5)
    x, weight = torch.randn(3, 203, generator=generator), torch.randn(203, generator=generator)
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(kernel.rms_norm(x, weight, 1e-5), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama3", "qwen2", "mistral"])
def test_a_verify_pass_reproduces_decode_steps_bit_for_bit(checkpoint_factory, family, monkeypatch):
    for path in cpu_paths.runnable_paths():  # the model on each path in turn
        monkeypatch.setenv("EDGE_CPU_KERNEL", path)
        model = load_model(checkpoint_factory(family))
        assert model.runner.matmul is not None and model.runner.matmul.path.startswith(path)
        cache = KVCache.for_model(model.config, 128, dtype=torch.float32, device=torch.device("cpu"))
        tokens = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
        with torch.inference_mode():
            model(tokens[:, :30], 0, cache)  # a prompt longer than the kernel's row limit: torch's matmul
            verify = model.logits(model(tokens[:, 30:36], 30, cache))[0]  # (6, V)
            cache.rollback(30)
            steps = torch.cat([model.logits(model(tokens[:, i:i + 1], i, cache))[0] for i in range(30, 36)])
        assert torch.equal(verify, steps), path


def test_the_fused_step_matches_transformers_on_widths_that_are_no_lane_multiple(tokenizer_dir, tmp_path,
                                                                                 monkeypatch):
    """An MLP 172 wide and contexts of 12-15 positions leave part-filled vectors in SwiGLU and the softmax; the fused
    step (one row, then three) must still compute transformers' logits on every path."""
    import transformers

    from tests.conftest import build_checkpoint

    folder = build_checkpoint(tmp_path / "odd", "llama3", tokenizer_dir, intermediate_size=172)
    tokens = torch.randint(0, 300, (1, 15), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()(tokens).logits[0]  # (15, V)
    for path in cpu_paths.runnable_paths():
        monkeypatch.setenv("EDGE_CPU_KERNEL", path)
        model = load_model(folder)
        cache = KVCache.for_model(model.config, 32, dtype=torch.float32, device=torch.device("cpu"))
        with torch.inference_mode():
            model(tokens[:, :11], 0, cache)
            one = model.logits(model(tokens[:, 11:12], 11, cache))[0]  # (1, V)
            three = model.logits(model(tokens[:, 12:15], 12, cache))[0]  # (3, V)
        assert model.runner.fused_format, path  # the fused step ran
        torch.testing.assert_close(torch.cat((one, three)), reference[11:], rtol=1e-4, atol=1e-4, msg=path)


@pytest.mark.parametrize("path", [pytest.param(name, marks=[pytest.mark.slow] if name == "avx512-emulated" else [])
                                  for name in kernel_path_names()])
def test_gemma3_and_phi3_layers_run_in_the_fused_calls_on_every_path(checkpoint_factory, path):
    """Gemma 3's sandwich norms, GeGLU, local layers (their window and rope base), scaled embedding and scores and
    capped logits; Phi-3's partial rotary and LongRoPE's tables: in the fused calls on each path (the avx512 code
    emulated), the step and the layers compute transformers' logits, a verify pass and a token tree reproduce the
    decode steps bit for bit, and one-call greedy drafting picks what the decode steps pick."""
    import transformers

    tokens = torch.randint(0, 300, (1, 19), generator=torch.Generator().manual_seed(8))
    for family in ("gemma3_scaled", "phi3", "phi3_longrope"):
        folder = checkpoint_factory(family)
        with torch.no_grad():
            reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(tokens)
        model = load_model(folder)
        use_kernel(model, kernel_for(path))
        cache = model.new_cache(32)
        with torch.inference_mode():
            model.forward_logits(tokens[:, :12], 0, cache)  # past gemma3_scaled's window of 6
            tree = model.forward_logits(tokens[:, [12, 13, 14, 17]], 12, cache, parents=[-1, 0, 1, 0])[0]  # (4, V)
            cache.rollback(13)
            branch = model.forward_logits(tokens[:, 17:18], 13, cache)[0]  # the tree's last row: 17 after 12
            cache.rollback(12)
            verify = model.forward_logits(tokens[:, 12:16], 12, cache)[0]  # (4, V)
            cache.rollback(12)
            steps = torch.cat([model.forward_logits(tokens[:, i:i + 1], i, cache)[0] for i in range(12, 16)])
            layers = model.logits(model(tokens[:, 16:18], 16, cache))[0]  # fused_layers, the head in torch
            drafted = draft_greedy(model, DraftRequest([int(tokens[0, 18])], 18, cache, 3, kernel_head(model)))
            cache.rollback(18)
            picked = [int(tokens[0, 18])]
            for position in range(18, 21):
                picked.append(int(model.forward_logits(torch.tensor([picked[-1:]]), position, cache)[0, -1].argmax()))
        assert model.runner.fused_format == "float32", family
        assert torch.equal(verify, steps) and torch.equal(tree, torch.cat((steps[:3], branch))), family
        torch.testing.assert_close(torch.cat((steps, layers)), reference.logits[0, 12:18], rtol=1e-4, atol=1e-4,
                                   msg=family)
        assert drafted.tokens == picked[1:], family


@pytest.mark.parametrize("path", cpu_paths.runnable_paths())
@pytest.mark.parametrize("weights", ["float32", "float16", "int8", "int4"])
def test_greedy_speculation_equals_plain_decoding_for_every_weights_format_on_every_path(llama_dir, half_llama_dir,
                                                                                        monkeypatch, path, weights):
    from edge import Engine

    monkeypatch.setenv("EDGE_CPU_KERNEL", path)
    folder = half_llama_dir if weights == "float16" else llama_dir
    packed = weights if weights in ("int8", "int4") else None
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    plain = Engine.load(folder, max_context=256, weights=packed)
    fast = Engine.load(folder, max_context=256, weights=packed, drafter="early-exit:1",
                       draft_length=2)  # fixed: an adaptive length may pause where drafting measures slower
    assert fast.model.runner.matmul.path.startswith(path)
    expected = [t for e in plain.generate(prompt, max_new_tokens=60, temperature=0.0, ignore_eos=True) for t in e.token_ids]
    events = list(fast.generate(prompt, max_new_tokens=60, temperature=0.0, ignore_eos=True))
    # the kernel ran the weights as stored or quantized (int4: edge's 4-bit blocks)
    assert fast.model.runner.fused_format == {"int4": "blocks"}.get(weights, weights)
    assert [t for e in events for t in e.token_ids] == expected
    assert events[-1].stats.steps < 60  # it did speculate


def test_each_path_can_be_forced_and_a_wrong_one_is_a_clear_error(monkeypatch):
    runnable = cpu_paths.runnable_paths()
    assert runnable[-1] == "portable" and len(runnable) >= 2 or cpu_paths.machine() not in ("x86_64", "aarch64")
    for path in runnable:
        monkeypatch.setenv("EDGE_CPU_KERNEL", path)
        assert CpuKernel.load().path.startswith(path)
    monkeypatch.setenv("EDGE_CPU_KERNEL", "sse9")
    with pytest.raises(cpu_paths.KernelPathError, match="sse9 is not a CPU kernel path; use one of"):
        CpuKernel.load()
    missing = [name for name in cpu_paths.PATHS if name not in runnable]
    if missing:  # e.g. neon on x86, avx512 on an AVX2 machine
        monkeypatch.setenv("EDGE_CPU_KERNEL", missing[0])
        with pytest.raises(cpu_paths.KernelPathError, match=f"{missing[0]}: this CPU lacks .*; use one of"):
            CpuKernel.load()


def test_a_forced_path_the_cpu_lacks_is_a_one_line_error_at_load(llama_dir, monkeypatch):
    from edge import EdgeError, Engine

    missing = [name for name in cpu_paths.PATHS if name not in cpu_paths.runnable_paths()]
    if not missing:
        pytest.skip("this CPU runs every path")
    monkeypatch.setenv("EDGE_CPU_KERNEL", missing[0])
    with pytest.raises(EdgeError, match=f"EDGE_CPU_KERNEL={missing[0]}: this CPU lacks"):
        Engine.load(llama_dir)


def test_without_a_compiler_edge_falls_back_to_torch(monkeypatch, tmp_path):
    """Neither the install's libraries nor a compiler: torch's matmul (an install built with EDGE_BUILD_PATHS=none)."""
    from edge.kernels import cpu_paths

    monkeypatch.setattr(cpu_paths, "PREBUILT_DIR", tmp_path / "no-prebuilt")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    assert CpuKernel.for_path.__wrapped__("portable") is None
    monkeypatch.setenv("EDGE_ROWWISE_MATMUL", "0")
    assert CpuKernel.load() is None


def test_the_fused_layer_follows_replaced_weights(llama_dir):
    """The fused layer caches weight pointers; loading new weights into the model must not leave them stale."""
    model, other = load_model(llama_dir), load_model(llama_dir)
    tokens = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        before = model.logits(model(tokens, 0, KVCache.for_model(model.config, 8)))
        assert model.runner.fused_format  # the fused path ran
        state = {name: tensor * 1.5 if tensor.ndim == 2 else tensor for name, tensor in other.state_dict().items()}
        model.load_state_dict(state, assign=True)
        after = model.logits(model(tokens, 0, KVCache.for_model(model.config, 8)))
        other.load_state_dict(state, assign=True)
        expected = other.logits(other(tokens, 0, KVCache.for_model(other.config, 8)))
    assert not torch.equal(before, after) and torch.equal(after, expected)


def test_the_bandwidth_probe_reads_its_buffer(kernel):
    assert kernel.read_bandwidth(megabytes=16, repeats=1) > 0.1  # GB/s; the figure itself is a benchmark's
