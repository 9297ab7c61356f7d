"""bench.fidelity's measures and its exact model: KL and top-1 agreement on logits made by hand, the float64 model of
a GGUF file against transformers on the checkpoint the file was written from, its 8-bit activation blocks against
edge's matmuls on the same inputs, and edge against it on small quantized files (tests/gguf_files.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.fidelity import divergences, edge_logits, paired, summary
from bench.gguf_reference import FileModel, eight_bit
from edge.sources import gguf_checkpoint
from tests.gguf_files import Q4_K_M, write_gguf


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Conversions go to the test's folder, not ~/.cache."""
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")


def windows_for(path, count: int = 2, steps: int = 24, seed: int = 0) -> torch.Tensor:
    vocabulary = FileModel(path).vocab_size
    return torch.randint(0, vocabulary, (count, steps), generator=torch.Generator().manual_seed(seed))  # (W, T)


def test_kl_and_top1_agreement_on_logits_made_by_hand():
    reference = np.array([[0.0, 0.0], [math.log(3), 0.0], [0.0, 5.0]])
    runtime = np.array([[0.0, 0.0], [0.0, math.log(3)], [0.0, 4.0]], dtype=np.float32)
    kl, agree = divergences(reference, runtime)
    p, q = 1 / (1 + math.exp(-5)), 1 / (1 + math.exp(-4))  # the second token's probability in the last row
    expected = [0.0, 0.5 * math.log(3), p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))]
    assert kl == pytest.approx(expected, abs=1e-7)
    assert agree.tolist() == [True, False, True]
    measured = summary(kl, agree)
    assert measured["mean_kl"] == pytest.approx(sum(expected) / 3, abs=1e-7)
    assert measured["later_mean_kl"] == pytest.approx((expected[1] + expected[2]) / 2, abs=1e-7)
    assert summary(kl, agree, steps=2)["later_mean_kl"] == pytest.approx(expected[1], abs=1e-7)
    assert measured["p99_kl"] == pytest.approx(np.percentile(expected, 99), abs=1e-7)
    assert measured["top1"] == pytest.approx(2 / 3) and measured["positions"] == 3
    other = summary(np.array([0.0, 0.0, 0.3]), np.array([True, True, True]))
    difference = paired(measured, other)
    assert difference["mean_kl"] == pytest.approx((expected[1] + expected[2] - 0.3) / 3, abs=1e-7)
    spread = np.array(expected) - [0.0, 0.0, 0.3]
    assert difference["standard_error"] == pytest.approx(spread.std() / math.sqrt(3), abs=1e-7)
    assert difference["top1"] == pytest.approx(-1 / 3)
    assert math.isnan(difference["later_window_standard_error"]) and difference["windows"] == 1  # one window
    by_window = paired(summary(np.array([0.0, 0.1, 0.2, 0.0, 0.4, 0.6]), np.ones(6, bool), steps=3),
                       summary(np.array([0.0, 0.2, 0.2, 0.0, 0.2, 0.2]), np.ones(6, bool), steps=3))
    means = np.array([-0.05, 0.3])  # each window's difference past its first position
    assert by_window["windows"] == 2 and by_window["windows_closer"] == 1
    assert by_window["later_window_standard_error"] == pytest.approx(means.std(ddof=1) / math.sqrt(2), abs=1e-9)
    assert difference["later_mean_kl"] == pytest.approx((expected[1] + expected[2] - 0.3) / 2, abs=1e-7)
    with pytest.raises(SystemExit):
        divergences(reference, runtime[:, :1])


def test_eight_bit_blocks_quantize_as_the_runtimes_do():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0] * 8 + [3.0] + [0.0] * 31], dtype=torch.float64)  # (1, 64): 2 blocks
    values, _ = eight_bit(x, 32)
    scale = torch.tensor(1.0 / 127).half().double()
    assert values[0, :4].tolist() == [64 * scale.item(), -127 * scale.item(), 32 * scale.item(), 0.0]
    assert values[0, 32].item() == 127 * torch.tensor(3.0 / 127).half().double().item()
    wide, _ = eight_bit(x, 256)  # one block of 256 (padded), its scale in float32
    assert wide[0, 32].item() == 127 * (1.0 / torch.tensor(127.0 / 3.0, dtype=torch.float32)).double().item()
    assert wide[0, 1].item() == round(-127 / 3) * (1.0 / torch.tensor(127.0 / 3.0, dtype=torch.float32)).double().item()


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_the_exact_model_is_the_checkpoint_in_float64(checkpoint_factory, tmp_path, family):
    """An f32 file holds the checkpoint's values: the exact model gives transformers' logits in float64 (llama's
    permuted q/k rows and Llama 3's rope factors, qwen2's biases and halves rotation, qwen3's q/k norms)."""
    import transformers

    folder = checkpoint_factory(family)
    path = write_gguf(folder, tmp_path / f"{family}.f32.gguf", "f32")
    windows = windows_for(path)
    exact = FileModel(path).logits(windows)  # (W * T, V)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    with torch.no_grad():
        expected = model(windows).logits.reshape(exact.shape).numpy()
    assert np.abs(exact - expected).max() < 1e-5 * np.abs(expected).max()


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory, tokenizer_dir):
    """A llama3 checkpoint whose matrices are whole blocks of 256 (what the k-quants need), its weights at the usual
    initial scale (a larger one makes a random model chaotic: one activation code rounded the other way, in a near
    tie, then moves every later position)."""
    from tests.conftest import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("wide"), "llama3", tokenizer_dir, hidden_size=256,
                            intermediate_size=512, initializer_range=0.02)


# each matrix its own type: every block format edge reads, with and without a minimum, per 32 and per 256
MIXTURE = {"default": "q8_0", "attn_output": "q4_1", "ffn_down": "q5_k", "ffn_gate": "q6_k", "ffn_up": "q6_k",
           "output": "q4_k", "token_embd": "q5_0"}


def test_eight_bit_inputs_give_edge_s_matmuls(wide_dir, tmp_path):
    """On the same inputs, each of edge's block matmuls is the exact product with 8-bit activation blocks, to float32
    rounding, and measurably not the product with the inputs as they are."""
    from edge.engine import Engine

    path = write_gguf(wide_dir, tmp_path / "mixed.gguf", MIXTURE)
    model, modules = FileModel(path), dict(Engine.load(path, max_context=32).model.named_modules())
    pairs = {"layers.0.attn.wo": ["blk.0.attn_output"], "layers.1.ffn.w_down": ["blk.1.ffn_down"],
             "layers.0.ffn.w_gate_up": ["blk.0.ffn_gate", "blk.0.ffn_up"], "lm_head": ["output"]}
    for name, tensors in pairs.items():
        columns = model.tensors[f"{tensors[0]}.weight"].shape[0]  # GGUF's shapes: (K, N)
        x = 3 * torch.randn(5, columns, generator=torch.Generator().manual_seed(0))  # (5, K)
        with torch.inference_mode():
            y = modules[name](x).double()  # (5, N)
        expected = torch.cat([model.project(x.double(), tensor, eight_bit_inputs=True) for tensor in tensors], dim=1)
        plain = torch.cat([model.project(x.double(), tensor, eight_bit_inputs=False) for tensor in tensors], dim=1)
        scale = y.abs().max()
        assert (y - expected).abs().max() < 1e-5 * scale, name
        assert (y - plain).abs().max() > 1e-3 * scale, name


@pytest.mark.parametrize("family, qtype", [("llama3", "q8_0"), ("qwen2", "q4_1"), ("wide", Q4_K_M)],
                         ids=["llama3-q8_0", "qwen2-q4_1", "llama3-q4_k_m"])
def test_edge_is_close_to_the_exact_model(checkpoint_factory, wide_dir, tmp_path, family, qtype):
    """edge's logits on a quantized file, in 5-row calls and in one call per window, are close to the exact model's:
    what is left is what its 8-bit activation blocks and float32 arithmetic cost."""
    folder = wide_dir if family == "wide" else checkpoint_factory(family)
    path = write_gguf(folder, tmp_path / "tiny.gguf", qtype)
    windows = windows_for(path)
    exact = FileModel(path).logits(windows)
    for rows in (5, None):
        out = tmp_path / f"edge-{rows}.npy"
        edge_logits({"model": str(path), "windows": windows.tolist(), "rows": rows, "out": str(out)})
        measured = summary(*divergences(exact, np.load(out)))
        assert measured["mean_kl"] < 1e-3 and measured["top1"] > 0.9
