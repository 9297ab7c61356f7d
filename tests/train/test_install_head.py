"""python -m train.install_head: the one command that builds a GGUF model's EAGLE-3 head (corpus, the model's own
replies, features, training) and installs it where edge-chat finds it, resumable at every step."""

from __future__ import annotations

import json

import pytest

from edge.sources import gguf_checkpoint
from edge.sources.installed_heads import installed_head
from tests.gguf_files import write_gguf
from train import install_head

TINY = ["--replies", "2", "--corpus-count", "3", "--intermediate", "32", "--held-out", "1", "--corpus-modules", "2"]


@pytest.fixture(autouse=True)
def folders(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")
    monkeypatch.setenv("EDGE_DATA_DIR", str(tmp_path / "data"))


@pytest.mark.slow
def test_one_command_builds_and_installs_a_head_and_goes_on_where_it_stopped(llama_dir, tmp_path, capsys):
    model = write_gguf(llama_dir, tmp_path / "m.q8_0.gguf", "q8_0")
    assert install_head.main([str(model), *TINY, "--steps", "2"]) == 0
    folder = installed_head(model)
    assert folder is not None and json.loads((folder / "card.json").read_text())["steps"] == 2
    work = next((tmp_path / "data" / "training").iterdir())  # the model's work folder in edge's data folder
    assert {"corpus", "replies.jsonl", "run"} <= {path.name for path in work.iterdir()}
    replies = (work / "replies.jsonl").read_text()
    kinds = [json.loads(line)["kind"] for line in replies.splitlines()]  # two corpus questions, two task requests
    assert len(kinds) == 4 and "reply" in kinds
    assert "skipped" in kinds  # a request longer than this model's 512-token context is a line, not a stop
    capsys.readouterr()
    assert install_head.main([str(model), *TINY, "--steps", "3"]) == 0  # more steps: the same work goes on
    err = capsys.readouterr().err
    assert "already holds these 4 replies" in err and "step 3 of 3" in err
    assert (work / "replies.jsonl").read_text() == replies
    assert json.loads((installed_head(model) / "card.json").read_text())["steps"] == 3


def test_a_model_that_is_not_pulled_or_not_a_gguf_file_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # nothing pulled
    with pytest.raises(SystemExit) as stopped:
        install_head.main(["qwen2.5-coder-1.5b"])
    assert "qwen2.5-coder-1.5b is not downloaded; run `edge pull qwen2.5-coder-1.5b` first" in str(stopped.value.code)
    with pytest.raises(SystemExit) as stopped:
        install_head.main([str(tmp_path / "nothing-here")])
    assert "neither a .gguf file nor a model of `edge list`" in str(stopped.value.code)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    with pytest.raises(SystemExit) as stopped:
        install_head.main([str(tmp_path / "weights.bin")])
    assert stopped.value.code == 2 and "is not a GGUF file edge reads" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # nothing written for a refused model


def test_the_replies_are_drafted_by_a_smaller_file_beside_the_model(llama_dir, tmp_path, capsys):
    model = write_gguf(llama_dir, tmp_path / "m.f32.gguf", "f32")
    assert install_head.reply_drafter(model) is None
    draft = write_gguf(llama_dir, tmp_path / "m.q4_0.gguf", "q4_0")
    assert install_head.reply_drafter(model) == f"draft:{draft}"
    assert "the replies are drafted by m.q4_0.gguf" in capsys.readouterr().err
