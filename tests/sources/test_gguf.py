"""GGUF files load through the gguf package into edge's checkpoint folders: greedy output equals the same weights
loaded from safetensors, token for token, plain and speculative; the tokenizer taken from the file encodes and
decodes as the original tokenizer.json. The files are written here (tests/gguf_files.py), as llama.cpp writes them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

from tests import gguf_files
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGUFWriter
from tests.gguf_files import reference_folder, write_gguf

from edge import CheckpointError, Engine, UnsupportedModelError
from edge.sources import gguf_checkpoint
from edge.model.block_weights import BlockEmbedding
from edge.model.packed_weights import packed_format
from edge.sources.loading import load_model
from edge.kernels import cpu_paths
from edge.sources.gguf_checkpoint import checkpoint_from_gguf
from edge.sources.gguf_tokenizer import (
    PRE_TOKENIZERS,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TokenizerFiles,
)
from edge.text.tokenizer import Tokenizer
from edge.kernels.cache import cache_folder
from tests.helpers import greedy

PROMPT = "Speculative decoding drafts several tokens"
greedy_24 = partial(greedy, prompt=PROMPT, max_new_tokens=24, max_context=128)  # each model loaded with these
TEXTS = ["The quick brown fox jumps over the lazy dog.", "def main():\n    return sum(range(10))  # 12345",
         "  leading spaces, trailing  ", "Les modèles tournent. 日本語のテキスト 🙂🚀",
         "<|im_start|>user\nhi<|im_end|>\n", ""]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Conversions go to the test's folder, not ~/.cache (where edge's compiled kernels stay)."""
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory, tokenizer_dir):
    """A llama3 checkpoint whose matrices are whole blocks of 256 (what the k-quants need)."""
    from tests.conftest import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("wide"), "llama3", tokenizer_dir, hidden_size=256,
                            intermediate_size=512)


def test_the_cache_keeps_only_what_loading_needs(llama_dir, tmp_path):
    """Settings, tokenizer and the tensor index: the weights stay in the file."""
    engine = Engine.load(write_gguf(llama_dir, tmp_path / "tiny.q8_0.gguf", "q8_0"), max_context=128)
    assert engine.spec.path.name == "tiny.q8_0" and engine.spec.path.is_relative_to(tmp_path / "cache")
    assert sorted(path.name for path in engine.spec.path.iterdir()) == [
        "config.json", "gguf.json", "tokenizer.json", "tokenizer_config.json"]
    assert sum(path.stat().st_size for path in engine.spec.path.iterdir()) < 200_000


@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16"])
def test_a_float_gguf_file_decodes_as_its_weights_from_safetensors(llama_dir, tmp_path, qtype):
    """Llama 3 (rope_freqs, q/k rows permuted by llama.cpp): the file's greedy output equals the checkpoint holding
    the same values, plain and speculative; f32 equals the original checkpoint itself."""
    gguf = write_gguf(llama_dir, tmp_path / f"tiny.{qtype}.gguf", qtype)
    expected = greedy_24(reference_folder(llama_dir, tmp_path / "reference", qtype))
    assert greedy_24(gguf) == expected
    assert greedy_24(gguf, drafter="early-exit:1") == expected
    if qtype == "f32":
        assert expected == greedy_24(llama_dir)


QUANTIZED = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m"]


def quantized_file(qtype: str, llama_dir, wide_dir, tmp_path, **types):
    """A file of the type (k-quants on the wide checkpoint; `types` overrides some tensors' types) and what it holds,
    dequantized, in float32."""
    folder = wide_dir if qtype.startswith(("q4_k", "q5_k", "q6_k")) else llama_dir
    kind = {**(gguf_files.Q4_K_M if qtype == "q4_k_m" else {"default": qtype}), **types}
    name = "-".join([qtype, *types.values()])
    tmp_path.mkdir(parents=True, exist_ok=True)
    return (write_gguf(folder, tmp_path / f"tiny.{name}.gguf", kind),
            reference_folder(folder, tmp_path / f"reference-{name}", kind, torch.float32))


def quantized_activations(x: torch.Tensor, block: int) -> torch.Tensor:
    """x (..., K) as llama.cpp quantizes a matmul's input for a type with `block`-weight blocks (32: its Q8_0, with a
    float16 scale; 256: its Q8_K): the values the 8-bit codes and scale stand for."""
    blocks = x.reshape(*x.shape[:-1], -1, block)
    top = blocks.abs().amax(-1, keepdim=True)
    full = torch.full_like(top, 127.0)  # tensor / tensor: torch computes a Python number / tensor as a reciprocal
    inverse = torch.where(top > 0, full / top, torch.zeros_like(top))  # times it, an ulp off a true division
    codes = torch.round(blocks * inverse).clamp(-127, 127)  # ties to even, as the kernel and llama.cpp's x86 code
    scale = (top / full).half().float() if block == 32 else torch.where(top > 0, torch.ones_like(top) / inverse, top)
    return (codes * scale).reshape(x.shape)


def block_mins(weight: torch.Tensor, qtype: str) -> torch.Tensor:
    """(N, K) -> (N, K / 32) the mins m of its Q4_1 / Q5_1 blocks (float16 after the scale d in each block)."""
    raw = gguf_files.quantized(weight.numpy(), qtype).reshape(weight.shape[0], -1, 20 if qtype == "q4_1" else 24)
    return torch.from_numpy(raw[:, :, 2:4].copy().view(np.float16).astype(np.float32)[..., 0])


def llama_cpp_matmul(x: torch.Tensor, weight: torch.Tensor, bias, block: int, mins: torch.Tensor | None):
    """x @ weight.T (+ bias) as llama.cpp computes it: x quantized for the type's blocks; for Q4_1 / Q5_1 each block's
    d q and m terms apart, m times the block's code sum kept in float16 (its Q8_1 `s`)."""
    quantized = quantized_activations(x, block)
    if mins is None:
        return F.linear(quantized, weight, bias)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    top = blocks.abs().amax(-1)
    full = torch.full_like(top, 127.0)
    sums = torch.round(blocks * torch.where(top > 0, full / top, torch.zeros_like(top))[..., None]).sum(-1)
    scaled_sums = (sums * (top / full)).half().float()  # (..., K / 32)
    out = F.linear(quantized, weight - mins.repeat_interleave(32, dim=1)) + F.linear(scaled_sums, mins)
    return out if bias is None else out + bias


def llama_cpp_logits(folder: Path, tokens: torch.Tensor, qtype: str) -> torch.Tensor:
    """The logits of the float model holding a file's values, each matmul as llama.cpp computes it for `qtype` (every
    projection and the head in that type)."""
    model = load_model(folder)
    model.runner.use(None)  # torch's matmul, through each module (replaced below)
    block = 256 if qtype.endswith("_k") else 32
    minned = qtype in ("q4_1", "q5_1")

    def emulate(module) -> None:
        weight = module.weight.float()
        mins = block_mins(weight, qtype) if minned else None
        module.forward = lambda x: llama_cpp_matmul(x, weight, module.bias, block, mins)

    for layer in model.layers:
        for module in (layer.attn.wqkv, layer.attn.wo, layer.ffn.w_gate_up, layer.ffn.w_down):
            emulate(module)
    head = model.head_weight.float()
    with torch.inference_mode():
        hidden = model(tokens, 0, model.new_cache(64))[0]  # (T, D)
        return llama_cpp_matmul(hidden, head, None, block, block_mins(head, qtype) if minned else None)


@pytest.mark.slow
@pytest.mark.parametrize("qtype", QUANTIZED)
def test_a_quantized_file_runs_in_its_own_types(llama_dir, wide_dir, tmp_path, qtype):
    """Every matrix, the embedding and the head keep the file's types (no 16-bit copy). The logits are those of plain
    float32 arithmetic on the file's values within what 8-bit activations move (3% here for the 32-weight types, 8%
    for the k-quants' 256-wide blocks), and those of llama.cpp's arithmetic (activations quantized per 32 or 256)
    within 3%: each matmul alone is llama.cpp's within float rounding (test_block_formats.py), but a last-bit
    difference in a norm or the attention flips an activation's 8-bit code where it lies on a rounding tie, and the
    flip travels on. Greedy speculation equals plain decoding."""
    gguf, reference = quantized_file(qtype, llama_dir, wide_dir, tmp_path)
    engine = Engine.load(gguf, max_context=128)
    model = engine.model
    assert packed_format(model) == "blocks" and isinstance(model.embed, BlockEmbedding)
    types = {fmt for block in model.layers for linear in (block.attn.wqkv, block.attn.wo, block.ffn.w_gate_up,
                                                           block.ffn.w_down) for fmt in linear.matrix.formats}
    assert types == ({"q4_k", "q6_k"} if qtype == "q4_k_m" else {qtype})
    assert not any(p.is_floating_point() and p.dim() == 2 for p in model.parameters())  # no float matrices
    float_model = load_model(reference)
    tokens = torch.tensor([Tokenizer.from_dir(reference).encode(PROMPT)])
    with torch.inference_mode():
        got = model.forward_logits(tokens, 0, model.new_cache(64))[0]  # (T, V)
        plain = float_model.forward_logits(tokens, 0, float_model.new_cache(64))[0]
    k_quant = qtype.startswith(("q4_k", "q5_k", "q6_k"))
    assert (got - plain).norm() / plain.norm() < (0.08 if k_quant else 0.03)
    plain = [t for e in engine.generate(PROMPT, max_new_tokens=24, ignore_eos=True, temperature=0.0) for t in e.token_ids]
    assert greedy_24(gguf, drafter="early-exit:1") == plain
    assert greedy_24(gguf, drafter="ngram") == plain
    emulated = llama_cpp_logits(reference, tokens, "q4_k" if qtype == "q4_k_m" else qtype)
    assert (got - emulated).norm() / emulated.norm() < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("path", cpu_paths.runnable_paths())
def test_greedy_speculation_equals_plain_decoding_on_every_path(llama_dir, wide_dir, tmp_path, monkeypatch, path):
    monkeypatch.setenv("EDGE_CPU_KERNEL", path)
    for qtype in ("q4_1", "q5_0", "q4_k_m", "q5_k"):
        gguf, _ = quantized_file(qtype, llama_dir, wide_dir, tmp_path / qtype)
        plain = Engine.load(gguf, max_context=128)
        assert plain.model.runner.matmul.path.startswith(path)
        expected = [t for e in plain.generate(PROMPT, max_new_tokens=24, ignore_eos=True, temperature=0.0) for t in e.token_ids]
        assert greedy_24(gguf, drafter="early-exit:2") == expected, qtype


def test_every_drafter_runs_on_a_gguf_target(llama_dir, wide_dir, tmp_path):
    """Self-drafts over the file's own layers, a separate draft model that is itself a .gguf file, n-gram lookup,
    and QuantSpec's int4 copy beside the file's blocks: each equals plain decoding."""
    gguf, _ = quantized_file("q4_k_m", llama_dir, wide_dir, tmp_path)
    draft, _ = quantized_file("q4_0", llama_dir, wide_dir, tmp_path / "draft")
    plain = greedy_24(gguf)
    for drafter in ("ngram", "skip:1", "adaptive", f"draft:{draft}"):
        assert greedy_24(gguf, drafter=drafter) == plain, drafter
    hierarchical = greedy_24(gguf, kv_cache="hierarchical")
    assert greedy_24(gguf, drafter="quantspec", kv_cache="hierarchical") == hierarchical


def test_a_gguf_draft_drafts_for_a_checkpoint_folder_and_the_other_way_round(llama_dir, wide_dir, tmp_path):
    """The tokenizer check compares a GGUF file's tokenizer with a Hugging Face one (the same vocabulary, read from
    the file's metadata); a trimmed head (SPEC@vocab.json) works on a GGUF draft."""
    draft, _ = quantized_file("q8_0", llama_dir, wide_dir, tmp_path)
    plain = greedy_24(llama_dir)
    assert greedy_24(llama_dir, drafter=f"draft:{draft}") == plain
    vocabulary = tmp_path / "vocab.json"
    vocabulary.write_text(json.dumps(list(range(0, 300))))
    assert greedy_24(llama_dir, drafter=f"draft:{draft}@{vocabulary}") == plain
    assert greedy_24(draft, drafter=f"draft:{llama_dir}") == greedy_24(draft)


def test_a_trimmed_head_of_a_gguf_draft_keeps_its_rows_in_8_bit_blocks(llama_dir, wide_dir, tmp_path):
    """A GGUF draft's trimmed head holds the kept rows in 8-bit blocks (not float): about a quarter of their float32
    bytes (rows padded to whole groups), scoring the kept tokens as the file's head does to within 8-bit rounding, every other token -inf."""
    from edge.model.trimmed_head import TrimmedHead

    draft, _ = quantized_file("q8_0", llama_dir, wide_dir, tmp_path)
    model = load_model(checkpoint_from_gguf(draft))
    kept = torch.arange(0, model.config.vocab_size, 3)  # (V',)
    head = TrimmedHead(model, kept)
    assert head.kernel_head.format == "blocks" and head.nbytes < kept.numel() * model.config.hidden_size * 1.25
    hidden = torch.randn(1, 2, model.config.hidden_size)  # (1, T, D)
    logits = head.logits(hidden)  # (V,)
    full = model.logits(hidden)[0, -1]  # (V,)
    torch.testing.assert_close(logits[kept], full[kept], rtol=0.02, atol=0.02 * float(full.abs().max()))
    dropped = torch.ones_like(logits, dtype=torch.bool)
    dropped[kept] = False
    assert torch.isinf(logits[dropped]).all()


def test_a_draft_model_is_trimmed_to_the_vocabulary_shipped_for_its_tokenizer(llama_dir, wide_dir, tmp_path,
                                                                               monkeypatch):
    """Where edge ships a draft vocabulary for the tokenizer (edge/models/*-vocab, found by the card's vocabulary
    hash), a draft model's head is cut to it without being asked; @full keeps the whole head. Output unchanged."""
    from edge.decoding import registry

    draft, _ = quantized_file("q8_0", llama_dir, wide_dir, tmp_path)
    shipped = tmp_path / "tiny-vocab"
    shipped.mkdir()
    vocab_hash = Tokenizer.from_dir(llama_dir).fingerprint()["vocab_sha256"]
    (shipped / "card.json").write_text(json.dumps({"vocab_sha256": vocab_hash}))
    (shipped / "vocab.json").write_text(json.dumps({"kept_ids": list(range(0, 300))}))
    monkeypatch.setattr(registry, "shipped_vocabularies", lambda: [shipped])
    engine = Engine.load(llama_dir)
    plain = greedy(engine, max_new_tokens=24)
    engine.use_drafter(f"draft:{draft}")
    assert engine.drafter.head is not None and engine.drafter.head.kept.tolist() == list(range(0, 300))
    assert greedy(engine, max_new_tokens=24) == plain
    engine.use_drafter(f"draft:{draft}@full")
    assert engine.drafter.head is None and greedy(engine, max_new_tokens=24) == plain


def test_a_matrix_kept_in_f16_beside_quantized_ones_runs_as_stored(llama_dir, wide_dir, tmp_path):
    """A quantized file that keeps some matrices in F16 (v and the down projections here): those segments run on
    the float kernel beside the blocks, the logits are the file's values', and speculation stays exact."""
    gguf, reference = quantized_file("q8_0", llama_dir, wide_dir, tmp_path, attn_v="f16", ffn_down="f16")
    engine = Engine.load(gguf, max_context=128)
    assert engine.model.layers[0].attn.wqkv.matrix.formats == ["q8_0", "q8_0", "f16"]
    assert engine.model.layers[0].ffn.w_down.matrix.formats == ["f16"]
    tokens = torch.tensor([Tokenizer.from_dir(reference).encode(PROMPT)])
    float_model = load_model(reference)
    with torch.inference_mode():
        got = engine.model.forward_logits(tokens, 0, engine.model.new_cache(64))[0]
        want = float_model.forward_logits(tokens, 0, float_model.new_cache(64))[0]
    assert (got - want).norm() / want.norm() < 0.03
    plain = [t for e in engine.generate(PROMPT, max_new_tokens=24, ignore_eos=True, temperature=0.0) for t in e.token_ids]
    assert greedy_24(gguf, drafter="early-exit:1") == plain


def test_the_plan_counts_a_gguf_file_at_its_stored_size(llama_dir, wide_dir, tmp_path, capsys):
    """The planner sizes the file's blocks as loading holds them (Q4_K and Q6_K segments, the embedding's blocks),
    for Engine.load's budget and for --plan; --weights int8 plans edge's int8 instead."""
    from edge.planning import plan_for
    from edge.tui.cli import main as chat_main

    gguf, _ = quantized_file("q4_k_m", llama_dir, wide_dir, tmp_path)
    plan = plan_for(gguf, budget="1GiB")
    assert plan.weight_dtype == "q4_k_m"
    assert plan.footprint.target_weights == Engine.load(gguf, max_context=64).model.weight_bytes()
    assert plan_for(gguf, budget="1GiB", weights="int8").weight_dtype == "int8"
    assert chat_main([str(gguf), "--plan"]) == 0
    assert json.loads(capsys.readouterr().out)["footprint"]["target_weights"] == plan.footprint.target_weights


def test_weights_float16_dequantizes_and_int4_requantizes(llama_dir, tmp_path):
    """--weights float16: the file's values in 16 bits (what earlier versions ran); --weights int4: edge's own
    format, re-quantized from them."""
    gguf = write_gguf(llama_dir, tmp_path / "tiny.q4_0.gguf", "q4_0")
    assert greedy_24(gguf, weights="float16") == greedy_24(reference_folder(llama_dir, tmp_path / "reference", "q4_0"))
    engine = Engine.load(gguf, max_context=128, weights="int4")
    assert {fmt for block in engine.model.layers for fmt in block.attn.wqkv.matrix.formats} == {"q4_1"}
    plain = [t for e in engine.generate(PROMPT, max_new_tokens=24, ignore_eos=True, temperature=0.0) for t in e.token_ids]
    assert greedy_24(gguf, weights="int4", drafter="early-exit:1") == plain


def test_a_type_the_kernel_does_not_run_is_one_line_naming_it(wide_dir, tmp_path):
    """TQ1_0 (ternary): refused with the types that run and what dequantizing would cost; --weights float16 runs it
    dequantized."""
    gguf = write_gguf(wide_dir, tmp_path / "tiny.tq1_0.gguf", {"default": "q8_0", "ffn_up": "tq1_0"})
    with pytest.raises(UnsupportedModelError, match=r"holds TQ1_0 tensors, which edge's kernel does not run \(it "
                                                    r"runs Q4_0, .*Q6_K.*--weights float16") as caught:
        Engine.load(gguf)
    assert "\n" not in str(caught.value)
    assert len(greedy_24(gguf, weights="float16")) == 24


def damaged(llama_dir, tmp_path, name: str, **changes) -> Path:
    return write_gguf(llama_dir, tmp_path / name, "q8_0", **changes)


@pytest.mark.parametrize("case, changes, message", [
    ("no-heads", dict(metadata={"attention.head_count": 0}), "head_count is 0, which no model has"),
    ("short-embedding", dict(keep=lambda name, values: values[:200] if name in ("token_embd.weight", "output.weight")
                             else values),
     "its tokenizer has 3.. tokens but token_embd.weight only 200 rows"),
    ("missing-layer", dict(keep=lambda name, values: None if name.startswith("blk.2.") else values),
     "layer 2 of block_count 3 has no blk.2.attn_k.weight"),
])
def test_a_damaged_file_is_one_line_and_never_cached(llama_dir, tmp_path, case, changes, message):
    gguf = damaged(llama_dir, tmp_path, f"{case}.gguf", **changes)
    with pytest.raises(CheckpointError, match=message) as caught:
        Engine.load(gguf)
    assert "\n" not in str(caught.value)
    assert not [path for path in (tmp_path / "cache").glob("*") if not path.name.endswith(".partial")]


def test_a_truncated_file_says_so(llama_dir, tmp_path):
    gguf = write_gguf(llama_dir, tmp_path / "cut.gguf", "q8_0")
    data = gguf.read_bytes()
    gguf.write_bytes(data[:-5000])
    with pytest.raises(CheckpointError, match="is truncated: tensor .* ends at byte|it ends before"):
        Engine.load(gguf)
    gguf.write_bytes(data[:3000])
    with pytest.raises(CheckpointError, match="not a readable GGUF file") as caught:
        Engine.load(gguf)
    assert "index" not in str(caught.value) and "axis" not in str(caught.value)


@pytest.mark.parametrize("short_by", [1, 3])
def test_a_file_a_few_bytes_short_says_it_is_truncated_not_what_numpy_said(llama_dir, tmp_path, short_by):
    gguf = write_gguf(llama_dir, tmp_path / "short.gguf", "q8_0")
    gguf.write_bytes(gguf.read_bytes()[:-short_by])
    with pytest.raises(CheckpointError) as caught:
        Engine.load(gguf)
    message = str(caught.value)
    assert "it is truncated: it ends inside the tensor data its header describes" in message
    assert "dtype" not in message and "download it again" in message


@pytest.mark.parametrize("tensor, keep, message", [
    ("token_embd.weight", lambda values: values[:, :0], r"token_embd.weight is \[320, 0\], with a dimension of 0"),
    ("token_embd.weight", lambda values: values[:0], r"token_embd.weight is \[0, 64\], with a dimension of 0"),
    ("blk.1.ffn_down.weight", lambda values: values[:0],
     r"tensor blk.1.ffn_down.weight is \[0, 128\], with a dimension of 0 \(the metadata implies \[64, 128\]\)"),
], ids=["embedding-width", "embedding-rows", "layer-matrix"])
def test_a_dimension_of_0_is_named_in_plain_numbers(llama_dir, tmp_path, tensor, keep, message):
    gguf = write_gguf(llama_dir, tmp_path / "zero.gguf", "f32",
                      keep=lambda name, values: keep(values) if name == tensor else values)
    with pytest.raises(CheckpointError, match=message) as caught:
        Engine.load(gguf)
    assert "np." not in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="needs pipes, /dev/zero")
def test_a_gguf_name_holding_a_pipe_or_a_device_is_named_for_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "pipe.gguf")
    (tmp_path / "zero.gguf").symlink_to("/dev/zero")
    (tmp_path / "gone.gguf").symlink_to(tmp_path / "nowhere.gguf")
    for name, kind in [("pipe.gguf", "a named pipe"), ("zero.gguf", "a symlink to /dev/zero, a character device"),
                       ("gone.gguf", f"a symlink to {tmp_path / 'nowhere.gguf'}, which does not exist")]:
        with pytest.raises(CheckpointError) as caught:
            Engine.load(tmp_path / name)
        assert str(caught.value).startswith(f"{tmp_path / name} is {kind}, not a model; pass a checkpoint folder")


@pytest.mark.parametrize("family", ["smollm", "qwen2", "qwen3", "llama_bias_linear_rope"])
def test_each_gguf_family_decodes_as_the_original(checkpoint_factory, tmp_path, family):
    """Tied embeddings (no output.weight), Qwen's q/k/v biases (rows not permuted), Qwen3's q/k norms, Llama's
    attention and MLP biases with linear rope scaling."""
    original = checkpoint_factory(family)
    gguf = write_gguf(original, tmp_path / f"{family}.gguf", "f32")
    assert greedy_24(gguf) == greedy_24(original)


def test_the_tokenizer_from_the_file_encodes_and_decodes_as_tokenizer_json(llama_dir, tmp_path):
    folder = checkpoint_from_gguf(write_gguf(llama_dir, tmp_path / "tiny.gguf"))
    ours, original = Tokenizer.from_dir(folder), Tokenizer.from_dir(llama_dir)
    for text in TEXTS:
        ids = original.encode(text)
        assert ours.encode(text) == ids
        assert ours.decode(ids) == original.decode(ids)
        assert ours.decode(ids, skip_special_tokens=False) == original.decode(ids, skip_special_tokens=False)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a KV cache?"}]
    assert ours.apply_chat_template(messages) == original.apply_chat_template(messages)
    assert ours.vocab_size == original.vocab_size
    eos = [ours.token_to_id("<|im_end|>"), ours.token_to_id("<|endoftext|>")]  # llama.cpp ends replies at both
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == eos


@pytest.mark.parametrize("pre", sorted({id(form): name for name, form in PRE_TOKENIZERS.items()}.values()))
def test_every_known_pre_tokenizer_round_trips_text(llama_dir, tmp_path, pre):
    folder = checkpoint_from_gguf(write_gguf(llama_dir, tmp_path / f"{pre}.gguf", pre=pre))
    tokenizer = Tokenizer.from_dir(folder)
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text


def test_a_sentencepiece_vocabulary_encodes_as_transformers_converts_it(tmp_path):
    """Llama 2 style ('llama' tokenizer: pieces and scores): merges rebuilt from the scores, byte fallback and the
    "▁" space marker, as transformers' LlamaConverter builds tokenizer.json from the same model."""
    sentencepiece = pytest.importorskip("sentencepiece")
    transformers = pytest.importorskip("transformers")
    from tests.conftest import TRAINING_TEXT

    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(TRAINING_TEXT), model_prefix=str(tmp_path / "sp"),
                                             vocab_size=420, model_type="bpe", byte_fallback=True,
                                             character_coverage=1.0, minloglevel=2)
    transformers.LlamaTokenizerFast(vocab_file=str(tmp_path / "sp.model"), legacy=True,  # as Llama 2 ships it
                                    add_prefix_space=True).save_pretrained(tmp_path / "hf")
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    size = pieces.get_piece_size()
    kinds = [TOKEN_UNKNOWN if pieces.is_unknown(i) else TOKEN_CONTROL if pieces.is_control(i) else
             TOKEN_BYTE if pieces.is_byte(i) else TOKEN_NORMAL for i in range(size)]
    files = TokenizerFiles.from_metadata({  # the keys convert_hf_to_gguf.py's _set_vocab_sentencepiece writes
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [pieces.id_to_piece(i) for i in range(size)],
        "tokenizer.ggml.scores": [pieces.get_score(i) for i in range(size)], "tokenizer.ggml.token_type": kinds,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True})
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "tokenizer.json").write_text(json.dumps(files.tokenizer_json))
    (tmp_path / "ours" / "tokenizer_config.json").write_text(json.dumps(files.tokenizer_config))
    ours, original = Tokenizer.from_dir(tmp_path / "ours"), Tokenizer.from_dir(tmp_path / "hf")
    for text in TEXTS + ["\n\ttabs and\nnew lines", "ÿ unseen ✓ characters"]:
        ids = original.encode(text)
        assert ours.encode(text) == ids and ids[0] == 1
        assert ours.decode(ids) == original.decode(ids)


def test_a_conversion_is_made_once_and_redone_when_the_file_changes(llama_dir, tmp_path):
    gguf = write_gguf(llama_dir, tmp_path / "tiny.gguf", "q8_0")
    said = []
    folder = checkpoint_from_gguf(gguf, report=said.append)
    assert len(said) == 1 and "tiny.gguf (q8_0" in said[0] and str(folder) in said[0]
    assert checkpoint_from_gguf(gguf, report=said.append) == folder and len(said) == 1
    assert [path.name for path in folder.parent.parent.iterdir()] == [folder.parent.name]  # no leftovers
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert checkpoint_from_gguf(gguf, report=said.append) != folder and len(said) == 2


def test_edge_chat_runs_a_gguf_file_and_says_it_read_it(llama_dir, tmp_path, capsys):
    from edge.tui.cli import main as chat_main

    gguf = write_gguf(llama_dir, tmp_path / "tiny.q4_0.gguf", "q4_0")
    assert chat_main([str(gguf), "--prompt", "hi", "--max-new-tokens", "4", "--raw"]) == 0
    assert "reading tiny.q4_0.gguf (q4_0" in capsys.readouterr().err
    assert chat_main([str(gguf), "--prompt", "hi", "--max-new-tokens", "4", "--raw"]) == 0
    assert "reading" not in capsys.readouterr().err  # the second run reads the cached folder


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF but not really" * 4)
    with pytest.raises(CheckpointError, match="not a readable GGUF file") as caught:
        Engine.load(bad)
    assert "\n" not in str(caught.value)


def test_an_architecture_edge_does_not_run_is_one_line(tmp_path):
    writer = GGUFWriter(tmp_path / "other.gguf", "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError,
                       match="'gpt2' model; edge runs the GGUF architectures gemma3, llama, phi3, qwen2, qwen3 "):
        checkpoint_from_gguf(tmp_path / "other.gguf")


LLAMA_CPP_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K"]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is a benchmark peer (pip install -e '.[peers]'), not a test dependency")
@pytest.mark.parametrize("ftype", LLAMA_CPP_TYPES)
def test_files_from_llama_cpps_own_quantizer(wide_dir, tmp_path, ftype):
    """llama.cpp's quantizer (its scale searches and its per-tensor choice of types in the _M mixtures) on an F32
    file: the result runs in its types and computes the model its bytes describe (close to the same file's values
    dequantized: on this random model llama.cpp's 4-bit types themselves move the logits by up to 60% from the F32
    file), and greedy speculation equals plain decoding."""
    import llama_cpp

    source = write_gguf(wide_dir, tmp_path / "tiny.f32.gguf", "f32")
    out = tmp_path / f"tiny.{ftype}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) == 0
    engine = Engine.load(out, max_context=128)
    assert packed_format(engine.model) == "blocks"
    tokens = torch.tensor([engine.tokenizer.encode(PROMPT)])
    dequantized = Engine.load(out, max_context=128, weights="float16").model  # the file's values, in 16 bits
    with torch.inference_mode():
        got = engine.model.forward_logits(tokens, 0, engine.model.new_cache(64))[0]
        want = dequantized.forward_logits(tokens, 0, dequantized.new_cache(64))[0]
    assert (got - want).norm() / want.norm() < 0.1  # 8-bit activations (measured 0.025-0.046)
    plain = [t for e in engine.generate(PROMPT, max_new_tokens=24, ignore_eos=True, temperature=0.0) for t in e.token_ids]
    assert greedy_24(out, drafter="early-exit:1") == plain


def llama_cpp_source():
    """A llama.cpp source tree already on this machine (EDGE_LLAMA_CPP_SOURCE, or the one edge-bench cached), or
    None: tests never download it."""
    given = os.environ.get("EDGE_LLAMA_CPP_SOURCE")
    candidates = [given] if given else sorted(cache_folder("llama.cpp-source").glob("*"))
    return next((Path(found) for found in candidates if (Path(found) / "convert_hf_to_gguf.py").is_file()), None)


@pytest.mark.skipif(llama_cpp_source() is None, reason="no llama.cpp source tree here (edge-bench --peers caches one)")
def test_a_file_from_llama_cpps_own_converter_decodes_as_the_original(llama_dir, tmp_path):
    """convert_hf_to_gguf.py itself (llama.cpp's permutation, rope_freqs, vocabulary and metadata, not this file's
    copy of them)."""
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports it (pip install -e '.[peers]')")
    out = tmp_path / "llama-cpp.gguf"
    done = subprocess.run([sys.executable, "-m", "bench.gguf_convert", str(llama_cpp_source()), str(llama_dir),
                           str(out), "f32"], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert greedy_24(out) == greedy_24(llama_dir)
    ours, original = Tokenizer.from_dir(checkpoint_from_gguf(out)), Tokenizer.from_dir(llama_dir)
    assert [ours.encode(text) for text in TEXTS] == [original.encode(text) for text in TEXTS]


def _array_count_offset(data: bytes, key: str) -> int:
    from tests.fuzz.gguf_fields import header_fields

    return next(field.offset for field in header_fields(data) if field.name == f"kv {key} count")


def test_a_damaged_array_count_is_refused_before_the_reader_walks_it(llama_dir, tmp_path):
    """One flipped byte made a 320-item array 16.8 million items long: the gguf package's reader walked it item by
    item (seconds on a 1 MiB file, hours on a real one) before it failed."""
    gguf = write_gguf(llama_dir, tmp_path / "count.gguf", "f32")
    data = bytearray(gguf.read_bytes())
    count = _array_count_offset(bytes(data), "tokenizer.ggml.token_type")  # a little-endian u64: 320
    data[count + 3] = 1
    gguf.write_bytes(data)
    with pytest.raises(CheckpointError, match=r"tokenizer.ggml.token_type claims 16,777,536 items, past any model's "
                                              r"2,097,152\); download it again") as caught:
        Engine.load(gguf)
    assert "\n" not in str(caught.value)
    data[count + 3], data[count + 2] = 0, 0x10  # 1,048,896 items: fewer than any cap, more than the file holds
    gguf.write_bytes(data)
    with pytest.raises(CheckpointError, match=r"tokenizer.ggml.token_type needs 4,195,584 bytes but the file has "
                                              r"[\d,]+ left"):
        Engine.load(gguf)


def test_an_array_longer_than_any_vocabulary_is_refused(llama_dir, tmp_path, monkeypatch):
    from edge.sources import gguf_header

    gguf = write_gguf(llama_dir, tmp_path / "long.gguf", "f32")
    monkeypatch.setattr(gguf_header, "MAX_ARRAY_ITEMS", 100)  # the file's vocabulary holds 320
    with pytest.raises(CheckpointError, match=r"tokenizer.ggml.tokens claims 320 items, past any model's 100"):
        Engine.load(gguf)


def test_a_tensor_type_gguf_does_not_define_is_named_without_numpy_reprs(llama_dir, tmp_path):
    """It showed the reader's "np.uint32(99) is not a valid GGMLQuantizationType"."""
    from tests.fuzz.gguf_fields import header_fields

    gguf = write_gguf(llama_dir, tmp_path / "type.gguf", "f32")
    data = bytearray(gguf.read_bytes())
    field = next(field for field in header_fields(bytes(data)) if field.name == "tensor token_embd.weight type")
    data[field.offset:field.offset + 4] = (99).to_bytes(4, "little")
    gguf.write_bytes(data)
    with pytest.raises(CheckpointError) as caught:
        Engine.load(gguf)
    message = str(caught.value)
    assert "tensor token_embd.weight has type code 99, which GGUF does not define" in message, message
    assert "np." not in message and "\n" not in message


def test_a_gguf_version_edge_does_not_read_is_named_with_the_versions_it_reads(llama_dir, tmp_path):
    gguf = write_gguf(llama_dir, tmp_path / "v1.gguf", "f32")
    data = bytearray(gguf.read_bytes())
    data[4:8] = (1).to_bytes(4, "little")
    gguf.write_bytes(data)
    with pytest.raises(CheckpointError) as caught:
        Engine.load(gguf)
    assert str(caught.value) == (f"{gguf} is not a readable GGUF file (it is GGUF version 1; edge reads versions 2 "
                                 "and 3, which current llama.cpp writes); download it again")


def test_an_end_of_sequence_id_outside_the_vocabulary_is_said_once_and_ignored(llama_dir, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(llama_dir, folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("eos_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 99_999}))
    path = write_gguf(folder, tmp_path / "far-eos.gguf", "q8_0")
    lines: list[str] = []
    checkpoint_from_gguf(path, report=lines.append)
    notes = [line for line in lines if line.startswith("note: ")]
    assert notes == [f"note: far-eos.gguf names end-of-sequence id 99999 outside its vocabulary of "
                     f"{config['vocab_size']:,} tokens; ignored"]  # its <|im_end|> still ends a reply
    checkpoint_from_gguf(path, report=lines.append)  # read from the cache: nothing more to say
    assert len(lines) == 2
    engine = Engine.load(path, max_context=64)
    assert engine.eos_token_ids and 99_999 not in engine.eos_token_ids
    assert len([t for e in engine.generate("Hello", max_new_tokens=6, temperature=0.0, ignore_eos=True)
                for t in e.token_ids]) == 6
