"""edge-export on a new user's probe: an unwritable destination, Ctrl+C, a write that fails, and base checkpoints
(no chat template: a completion model) with --chat-template FILE."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("onnx")

import edge.export.bundle as bundle_module  # noqa: E402
from edge.engine import Engine  # noqa: E402
from edge.errors import TokenizerError  # noqa: E402
from edge.export.bundle import ExportOptions, export_bundle  # noqa: E402
from edge.export.cli import main as export_main  # noqa: E402
from edge.export.vocab_trim import count_generated  # noqa: E402
from tests.helpers import sigint_as_from_a_terminal  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}")


def one_line(text: str, *needles: str) -> str:
    text = text.strip()
    assert text and "\n" not in text and "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


def fake_export(files: dict[str, str], error: BaseException | None = None):
    """Stands in for the graph export: writes `files` into the temporary folder, then raises `error` (or returns a
    manifest), so what export_bundle does around it is checked in milliseconds."""
    def run(checkpoint, workdir, options, progress):
        for name, text in files.items():
            (workdir / name).write_text(text)
        if error is not None:
            raise error
        return {"completion_model": False}

    return run


# ---- finding 2: the destination, Ctrl+C, failed writes ----

def test_an_unwritable_destination_is_one_line_naming_it_and_a_writable_folder(llama_dir, capsys):
    assert export_main([str(llama_dir), "-o", "/proc/edge-bundle", "--quiet"]) == 2
    err = one_line(capsys.readouterr().err, "edge-export:", "/proc/edge-bundle", "-o ")
    suggestion = Path(err.rpartition("-o ")[2])
    assert suggestion.name == "edge-bundle" and os.access(suggestion.parent, os.W_OK)


def test_ctrl_c_during_the_export_writes_nothing(llama_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bundle_module, "_export_edge_graphs", fake_export({"part": "x"}, KeyboardInterrupt()))
    output = tmp_path / "out" / "b"
    output.parent.mkdir()
    assert export_main([str(llama_dir), "-o", str(output)]) == 130
    err = capsys.readouterr().err
    one_line(err.strip().splitlines()[-1], f"export interrupted; nothing was written to {output}")
    assert list(output.parent.iterdir()) == []  # no bundle, no partial folder


def test_ctrl_c_with_overwrite_keeps_the_old_bundle(llama_dir, tmp_path, capsys, monkeypatch):
    output = tmp_path / "b"
    output.mkdir()
    (output / "manifest.json").write_text("{}")
    monkeypatch.setattr(bundle_module, "_export_edge_graphs", fake_export({"new": "x"}, KeyboardInterrupt()))
    assert export_main([str(llama_dir), "-o", str(output), "--overwrite", "--quiet"]) == 130
    one_line(capsys.readouterr().err, "nothing was written", "unchanged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"] and (output / "manifest.json").read_text() == "{}"


def test_ctrl_c_while_the_bundle_is_moved_into_place_is_held_back(llama_dir, tmp_path, monkeypatch):
    """The old code removed the old bundle, then renamed the new one: Ctrl+C between the two lost both."""
    output = tmp_path / "b"
    output.mkdir()
    (output / "manifest.json").write_text("{}")
    monkeypatch.setattr(bundle_module, "_export_edge_graphs", fake_export({"new": "x"}))
    real_replace = os.replace

    def replace_then_interrupt(source, destination):
        if output in (Path(source), Path(destination)):  # Ctrl+C while the old bundle or the new one moves
            os.kill(os.getpid(), signal.SIGINT)
        return real_replace(source, destination)

    monkeypatch.setattr(bundle_module.os, "replace", replace_then_interrupt)
    try:
        export_bundle(llama_dir, output, ExportOptions(overwrite=True), show_progress=False)
    except KeyboardInterrupt:
        pass  # then the output must still be the old bundle or the new one, not missing
    assert (output / "new").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_a_failed_write_is_one_line_and_leaves_nothing(llama_dir, tmp_path, capsys, monkeypatch):
    full = OSError(28, "No space left on device", str(tmp_path / "x"))
    monkeypatch.setattr(bundle_module, "_export_edge_graphs", fake_export({"part": "x"}, full))
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--quiet"]) == 2
    one_line(capsys.readouterr().err, "No space left on device", f"nothing was written to {tmp_path / 'b'}")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_the_first_seconds_is_one_line_and_exit_130(llama_dir, tmp_path):
    """A real SIGINT while edge-export imports torch (an interrupted import failed in its own ways: a
    KeyboardInterrupt traceback, or a RecursionError inside numpy)."""
    output = tmp_path / "b"
    child = subprocess.Popen([sys.executable, "-m", "edge.export.cli", str(llama_dir), "-o", str(output), "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=sigint_as_from_a_terminal)
    maps, deadline = Path(f"/proc/{child.pid}/maps"), time.monotonic() + 60
    while "libtorch" not in maps.read_text() and time.monotonic() < deadline:  # inside main(), importing torch
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    one_line(err, f"edge-export: export interrupted; nothing was written to {output}")
    assert list(tmp_path.iterdir()) == []


# ---- finding 4: base checkpoints and --chat-template ----

def test_a_base_checkpoint_exports_as_a_completion_model(base_dir, tmp_path, capsys):
    output = tmp_path / "b"
    assert export_main([str(base_dir), "-o", str(output), "--weights", "fp32", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "equals plain: yes" in captured.out
    one_line(captured.err, "completion model", "--chat-template FILE")
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["completion_model"] is True and manifest["chat_template"] is None
    engine = Engine.load(output)
    assert engine.tokenizer.chat_template is None and engine.complete("The quick", max_new_tokens=4)


def test_chat_template_puts_the_template_in_the_bundle_and_chat_uses_it(base_dir, tmp_path, capsys):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    output = tmp_path / "b"
    assert export_main([str(base_dir), "-o", str(output), "--weights", "fp32", "--quiet",
                        "--chat-template", str(template)]) == 0
    assert capsys.readouterr().err == ""  # a chat model: no completion-model note
    assert (output / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["completion_model"] is False
    assert manifest["chat_template"]["from"] == str(template.resolve())
    assert manifest["files"]["chat_template.jinja"]["bytes"] == len(TEMPLATE.encode())
    engine = Engine.load(output)
    messages = [{"role": "user", "content": "Hello"}]
    rendered = "<|im_start|>user: Hello<|im_end|>\n<|im_start|>assistant: "
    assert engine.tokenizer.apply_chat_template(messages) == rendered
    list(engine.chat(messages, max_new_tokens=3))
    prompt = engine.tokenizer.encode(rendered, add_special_tokens=False)
    assert engine.history[:len(prompt)] == prompt


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    (b"\xff\xfe{{ messages }}", "not UTF-8"),
    (b"{% for m in messages %}{{ m.content }", "line 1"),
    (b"  \n", "is empty"),
])
def test_a_bad_chat_template_file_is_one_line(llama_dir, tmp_path, capsys, content, needle):
    template = tmp_path / "t.jinja"
    if content is not None:
        template.write_bytes(content)
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--quiet", "--chat-template", str(template)]) == 2
    one_line(capsys.readouterr().err, "edge-export:", str(template), needle)
    assert not (tmp_path / "b").exists()


def test_calibration_of_a_base_model_continues_plain_text(base_dir):
    """VocabTrim's calibration rendered chats, which a base model has no template for."""
    engine = Engine.load(base_dir, max_context=128)
    with pytest.raises(TokenizerError):
        list(engine.chat([{"role": "user", "content": "hi"}], max_new_tokens=1))
    counts = count_generated(engine, ["The quick brown fox", "import os"], max_new_tokens=4)
    assert sum(counts.values()) == 8
    with_template = count_generated(engine, ["The quick brown fox"], max_new_tokens=4, chat_template=TEMPLATE)
    assert sum(with_template.values()) == 4
