"""NaN and Inf in a model's weights: refused at load when a norm, a bias or the embedding holds them, and at the first
step when the logits do, each time in one line naming the tensor (before, a GGUF file holding NaN answered with an
empty reply and exit code 0)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edge import CheckpointError, Engine
from edge.sources import gguf_checkpoint
from edge.tui.cli import main as chat_main
from tests.gguf_files import write_gguf


def damaged_copy(llama_dir: Path, tmp_path: Path, name: str, damage) -> Path:
    folder = tmp_path / "damaged"
    shutil.copytree(llama_dir, folder)
    tensors = load_file(folder / "model.safetensors")
    damage(tensors[name])
    save_file(tensors, folder / "model.safetensors")
    return folder


def set_nan(tensor: torch.Tensor) -> None:
    tensor.view(-1)[3] = float("nan")


@pytest.mark.parametrize("name, damage, message", [
    ("model.norm.weight", set_nan, r"tensor model.norm.weight holds NaN \(1 of 64 values\)"),
    ("model.layers.2.post_attention_layernorm.weight", lambda t: t.fill_(float("inf")),
     r"tensor model.layers.2.post_attention_layernorm.weight holds Inf \(64 of 64 values\)"),
    ("model.embed_tokens.weight", lambda t: t[:, 7].fill_(float("nan")),
     r"tensor model.embed_tokens.weight holds NaN \(\d+ of \d+ values\) in its rows"),
], ids=["final-norm", "layer-norm", "embedding"])
def test_a_norm_or_the_embedding_holding_nan_or_inf_is_refused_at_load(llama_dir, tmp_path, name, damage, message):
    folder = damaged_copy(llama_dir, tmp_path, name, damage)
    with pytest.raises(CheckpointError, match=message) as caught:
        Engine.load(folder)
    assert "\n" not in str(caught.value) and "download the model again" in str(caught.value)


def test_nan_inside_a_matrix_stops_the_first_reply_naming_the_tensor(llama_dir, tmp_path):
    folder = damaged_copy(llama_dir, tmp_path, "model.layers.1.mlp.down_proj.weight", set_nan)
    engine = Engine.load(folder, max_context=64)  # the load check reads the small tensors only
    with pytest.raises(CheckpointError) as caught:
        list(engine.generate("The quick brown fox", max_new_tokens=4))
    message = str(caught.value)
    assert message.startswith("the model's first logits hold ") and "NaN" in message
    assert "its tensor layers.1.ffn.w_down.weight holds NaN (1 of" in message and "\n" not in message


def test_a_gguf_file_holding_nan_is_one_line_and_exit_2_not_an_empty_reply(llama_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")

    def nan_in(name: str):
        def keep(gguf_name: str, values):
            if gguf_name == name:
                values = values.copy()
                values.reshape(-1)[5] = float("nan")
            return values
        return keep

    norm = write_gguf(llama_dir, tmp_path / "norm.gguf", "f32", keep=nan_in("output_norm.weight"))
    assert chat_main([str(norm), "--prompt", "hi", "--max-new-tokens", "4"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after the line saying the file is read once
    assert error.startswith(f"edge-chat: error: {norm}: tensor output_norm.weight holds NaN (1 of 64 values)")
    matrix = write_gguf(llama_dir, tmp_path / "matrix.gguf", "f32", keep=nan_in("blk.0.ffn_down.weight"))
    assert chat_main([str(matrix), "--prompt", "hi", "--max-new-tokens", "4"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "first logits hold" in captured.err and "layers.0.ffn.w_down.weight" in captured.err


def test_usable_logits_pass_and_masked_ones_are_not_mistaken_for_damage():
    from edge.model.finite import nonfinite_logits

    assert nonfinite_logits(torch.tensor([0.5, -1.0, float("-inf")])) is None  # -inf: a token ruled out
    assert nonfinite_logits(torch.tensor([0.5, float("nan"), 2.0])) == "1 NaN of 3 values"
    assert nonfinite_logits(torch.tensor([float("inf"), 0.0])) == "1 +Inf of 2 values"
    assert nonfinite_logits(torch.full((4,), float("-inf"))) == "no finite value among 4"
