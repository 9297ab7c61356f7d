"""GGUF files load through the gguf package into edge's checkpoint folders: greedy output equals the same weights
loaded from safetensors, token for token, plain and speculative; the tokenizer taken from the file encodes and
decodes as the original tokenizer.json. The files are written here (tests/gguf_files.py), as llama.cpp writes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFWriter
from gguf_files import reference_folder, write_gguf
from safetensors import safe_open

from edge import CheckpointError, Engine, UnsupportedModelError, gguf_checkpoint
from edge.gguf_checkpoint import checkpoint_from_gguf
from edge.gguf_tokenizer import (
    PRE_TOKENIZERS,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TokenizerFiles,
)
from edge.tokenizer import Tokenizer
from kernels.cache import cache_folder

PROMPT = "Speculative decoding drafts several tokens"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "def main():\n    return sum(range(10))  # 12345",
         "  leading spaces, trailing  ", "Les modèles tournent. 日本語のテキスト 🙂🚀",
         "<|im_start|>user\nhi<|im_end|>\n", ""]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Conversions go to the test's folder, not ~/.cache (where edge's compiled kernels stay)."""
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")


def greedy(model, drafter: str | None = None) -> list[int]:
    engine = Engine.load(model, max_context=128, drafter=drafter)
    return [token for event in engine.generate(PROMPT, max_new_tokens=24, ignore_eos=True)
            for token in event.token_ids]


def stored_dtypes(folder) -> set[str]:
    with safe_open(folder / "model.safetensors", "pt") as weights:
        return {weights.get_slice(name).get_dtype() for name in weights.keys()}


@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_a_gguf_file_decodes_as_its_weights_from_safetensors(llama_dir, tmp_path, qtype):
    """Llama 3 (rope_freqs, q/k rows permuted by llama.cpp): the file's greedy output equals the checkpoint holding
    the same values, plain and speculative; f32 equals the original checkpoint itself."""
    gguf = write_gguf(llama_dir, tmp_path / f"tiny.{qtype}.gguf", qtype)
    engine = Engine.load(gguf, max_context=128)
    assert engine.spec.path.name == f"tiny.{qtype}" and engine.spec.path.is_relative_to(tmp_path / "cache")
    assert stored_dtypes(engine.spec.path) == {{"f32": "F32", "bf16": "BF16"}.get(qtype, "F16")}
    expected = greedy(reference_folder(llama_dir, tmp_path / "reference", qtype))
    assert [t for e in engine.generate(PROMPT, max_new_tokens=24, ignore_eos=True) for t in e.token_ids] == expected
    assert greedy(gguf, drafter="early-exit:1") == expected
    if qtype == "f32":
        assert expected == greedy(llama_dir)


@pytest.mark.parametrize("family", ["smollm", "qwen2", "qwen3", "llama_bias_linear_rope"])
def test_each_gguf_family_decodes_as_the_original(checkpoint_factory, tmp_path, family):
    """Tied embeddings (no output.weight), Qwen's q/k/v biases (rows not permuted), Qwen3's q/k norms, Llama's
    attention and MLP biases with linear rope scaling."""
    original = checkpoint_factory(family)
    gguf = write_gguf(original, tmp_path / f"{family}.gguf", "f32")
    assert greedy(gguf) == greedy(original)


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
    from conftest import TRAINING_TEXT

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


def test_edge_chat_runs_a_gguf_file_and_says_it_converted_it(llama_dir, tmp_path, capsys):
    from tui.cli import main as chat_main

    gguf = write_gguf(llama_dir, tmp_path / "tiny.q4_0.gguf", "q4_0")
    assert chat_main([str(gguf), "--prompt", "hi", "--max-new-tokens", "4", "--raw"]) == 0
    assert "converting tiny.q4_0.gguf (q4_0" in capsys.readouterr().err
    assert chat_main([str(gguf), "--prompt", "hi", "--max-new-tokens", "4", "--raw"]) == 0
    assert "converting" not in capsys.readouterr().err  # the second run reads the cached folder


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
    with pytest.raises(UnsupportedModelError, match="'gpt2' model; edge runs the GGUF architectures llama, qwen2"):
        checkpoint_from_gguf(tmp_path / "other.gguf")


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
                           str(out), "f32"], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert greedy(out) == greedy(llama_dir)
    ours, original = Tokenizer.from_dir(checkpoint_from_gguf(out)), Tokenizer.from_dir(llama_dir)
    assert [ours.encode(text) for text in TEXTS] == [original.encode(text) for text in TEXTS]
