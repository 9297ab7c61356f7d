"""Draft models found beside a GGUF target: same tokenizer, a fraction of its size, headers only."""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter

from edge.sources.draft_finder import drafts_beside, tokenizer_fingerprint
from edge.frontend.options import default_drafter
from edge.tui.cli import build_parser

TOKENS = ["<s>", "</s>", "a", "b", "ab", "ba"]


def write_file(path, tokens, weights: int):
    """A GGUF file with `tokens` as its tokenizer and one tensor of `weights` float32 values (its size)."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_uint32("llama.block_count", 1)
    writer.add_tensor("token_embd.weight", np.zeros((weights // 8, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_smaller_file_with_the_same_tokenizer_is_found_smallest_first(tmp_path):
    target = write_file(tmp_path / "big.gguf", TOKENS, 40_000)
    small = write_file(tmp_path / "small.gguf", TOKENS, 8_000)
    smaller = write_file(tmp_path / "smaller.gguf", TOKENS, 4_000)
    write_file(tmp_path / "other-tokenizer.gguf", TOKENS[:-1] + ["bb"], 4_000)
    write_file(tmp_path / "as-large.gguf", TOKENS, 30_000)  # over half the target's size: no draft
    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 not a header")
    assert drafts_beside(target) == [smaller, small]
    assert drafts_beside(smaller) == []  # nothing beside it is small enough
    assert tokenizer_fingerprint(tmp_path / "broken.gguf") is None
    assert drafts_beside(tmp_path / "missing.gguf") == [] and drafts_beside(tmp_path) == []


def test_edge_chat_drafts_with_a_file_beside_a_named_model_and_says_so(tmp_path, capsys):
    target = write_file(tmp_path / "big.gguf", TOKENS, 40_000)
    small = write_file(tmp_path / "small.gguf", TOKENS, 8_000)
    parser = build_parser()
    assert default_drafter(parser.parse_args([str(target), "--temperature", "0"])) == f"draft:{small}"
    assert "drafting with small.gguf" in capsys.readouterr().err
    assert default_drafter(parser.parse_args([str(target), "--drafter", "none"])) is None
    assert default_drafter(parser.parse_args([str(target), "--temperature", "0.7"])) is None
    assert default_drafter(parser.parse_args([str(small), "--temperature", "0"])) is None  # none small enough
