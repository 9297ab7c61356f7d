"""bench.tiles: one line per block format a file holds, with the arithmetic of a row and of each extra row."""

from __future__ import annotations

from bench import tiles
from tests.gguf_files import write_gguf
from tests.conftest import build_checkpoint

MIXTURE = {"default": "q8_0", "attn_output": "q4_0", "ffn_down": "q6_k", "ffn_gate": "q4_k", "ffn_up": "q4_k",
           "output": "q5_k"}


def test_every_block_format_of_a_file_gets_its_row(tokenizer_dir, tmp_path, capsys):
    folder = build_checkpoint(tmp_path / "wide", "llama3", tokenizer_dir, hidden_size=256, intermediate_size=512)
    path = write_gguf(folder, tmp_path / "mixed.gguf", MIXTURE)  # matrices of whole 256-blocks, for the k-quants
    assert set(tiles.tensors_by_format(str(path))) == {"q8_0", "q4_0", "q6_k", "q4_k", "q5_k"}
    assert tiles.main([str(path), "--rows", "2,3", "--repeats", "1", "--kilobytes", "16"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| q")]
    assert sorted(line.split(" | ")[0].removeprefix("| ") for line in lines) == ["q4_0", "q4_k", "q5_k", "q6_k", "q8_0"]
    assert all(len(line.split(" | ")) == 7 for line in lines)  # format, weights, one row, extra, rate, c(2), c(3)
