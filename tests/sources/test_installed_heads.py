"""EAGLE-3 heads installed for a GGUF model (python -m train.eagle3 --install) and offered by default for that model
and its other quantizations, never for another model."""

from __future__ import annotations

import argparse

import pytest

from edge import Engine
from edge.frontend.options import default_drafter
from edge.sources import gguf_checkpoint
from edge.sources.installed_heads import heads_root, identity, install_head, installed_head
from tests.decoding.test_eagle3 import write_head
from tests.gguf_files import write_gguf
from tests.helpers import greedy


@pytest.fixture(autouse=True)
def folders(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")
    monkeypatch.setenv("EDGE_DATA_DIR", str(tmp_path / "data"))


def greedy_args(model) -> argparse.Namespace:
    return argparse.Namespace(drafter=None, temperature=0.0, model=str(model))


def test_every_quantization_of_a_model_shares_its_identity_and_another_model_does_not(llama_dir, checkpoint_factory,
                                                                                      tmp_path):
    q8, f32 = write_gguf(llama_dir, tmp_path / "m.q8_0.gguf", "q8_0"), write_gguf(llama_dir, tmp_path / "m.gguf")
    other = write_gguf(checkpoint_factory("qwen2"), tmp_path / "other.q8_0.gguf", "q8_0")
    assert identity(q8) is not None and identity(q8) == identity(f32) != identity(other)
    assert identity(llama_dir) is None and identity(tmp_path / "missing.gguf") is None  # GGUF files only


def test_an_installed_head_is_the_default_drafter_for_its_model_and_keeps_the_output(llama_dir, checkpoint_factory,
                                                                                     tmp_path, capsys):
    q8, f32 = write_gguf(llama_dir, tmp_path / "m.q8_0.gguf", "q8_0"), write_gguf(llama_dir, tmp_path / "m.gguf")
    other = write_gguf(checkpoint_factory("qwen2"), tmp_path / "other.q8_0.gguf", "q8_0")
    assert installed_head(q8) is None and not heads_root().exists()  # nothing installed: nothing offered
    folder = install_head(write_head(tmp_path / "trained", llama_dir), f32)  # trained on one file...
    assert folder.parent == heads_root() and installed_head(q8) == folder  # ...offered for its other quantization
    assert installed_head(other) is None
    spec = default_drafter(greedy_args(q8))
    assert spec == f"eagle3:{folder}" and "EAGLE-3 head built for this model" in capsys.readouterr().err
    assert default_drafter(argparse.Namespace(drafter=None, temperature=0.7, model=str(q8))) is None  # sampling
    assert default_drafter(greedy_args(other)) != spec
    plain = Engine.load(q8, max_context=128)
    assert greedy(Engine.load(q8, max_context=128, drafter=spec), max_new_tokens=24) == greedy(plain,
                                                                                                max_new_tokens=24)


def test_a_draft_model_beside_the_file_comes_before_an_installed_head(llama_dir, tmp_path, capsys):
    f32 = write_gguf(llama_dir, tmp_path / "m.gguf")
    folder = install_head(write_head(tmp_path / "trained", llama_dir), f32)
    assert default_drafter(greedy_args(f32)) == f"eagle3:{folder}"  # alone: the head
    q8 = write_gguf(llama_dir, tmp_path / "m.q8_0.gguf", "q8_0")  # a quarter of its size, the same tokenizer
    assert default_drafter(greedy_args(f32)) == f"draft:{q8}"  # a draft model measured faster: it comes first
    assert "drafting with m.q8_0.gguf" in capsys.readouterr().err


def test_installing_for_a_target_that_is_not_a_gguf_file_is_refused_before_training(llama_dir, tmp_path, capsys):
    from train.eagle3 import main as train_main

    with pytest.raises(SystemExit) as stopped:
        train_main(["--target", str(llama_dir), "--replies", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o"),
                    "--install"])
    assert stopped.value.code == 2 and "--install needs a GGUF target" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
