"""edge-export stopped by a real signal: SIGTERM and SIGHUP clean up as Ctrl+C does; SIGKILL cannot be handled, so
the folder it leaves is refused by the loader by name and removed by the next export of the same output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("onnx")

from edge.engine import Engine  # noqa: E402
from edge.errors import BundleError  # noqa: E402
from edge.export.bundle import ExportOptions, export_bundle  # noqa: E402
from edge.export.quantize import QuantSettings  # noqa: E402
from edge.export.workdir import WorkFolder, remove_stale_work_folders, work_folders  # noqa: E402


def start_export(checkpoint: Path, output: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "edge.export.cli", str(checkpoint), "-o", str(output), "--quiet",
                             "--weights", "fp32"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, child: subprocess.Popen, seconds: float = 120.0) -> None:
    """Poll until `condition()` holds (the export reached a stage), failing if the export ends first."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the export never reached the stage"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_the_export_and_leave_nothing(llama_dir, tmp_path, signum):
    output = tmp_path / "b"
    child = start_export(llama_dir, output)
    wait_for(lambda: work_folders(output), child)  # working: the checkpoint is being read or the graph built
    child.send_signal(signum)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 128 + signum, err
    assert err.strip() == f"edge-export: export interrupted; nothing was written to {output}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_killed_exports_folder_is_refused_and_the_next_export_removes_it(llama_dir, tmp_path):
    output = tmp_path / "b"
    child = start_export(llama_dir, output)
    wait_for(lambda: any((folder / "manifest.json").is_file() for folder in work_folders(output)), child)
    child.send_signal(signal.SIGKILL)  # while validating: the folder holds graphs and a manifest
    child.communicate(timeout=60)
    [left] = work_folders(output)
    with pytest.raises(BundleError, match=r"is an unfinished edge-export .* export again to .*b \(that removes"):
        Engine.load(left)
    export_bundle(llama_dir, output, ExportOptions(quant=QuantSettings("fp32")), show_progress=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["b"], (left.name, holders(left))
    Engine.load(output)


def holders(folder: Path) -> list[str]:
    """The processes with `folder` open ("pid: command line"), to say who kept a work folder's lock."""
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == str(folder):
                pid = fd.parent.parent.name
                command = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{pid}: {command}")
        except OSError:
            continue
    return found


def test_only_work_folders_no_export_holds_are_removed(tmp_path):
    output = tmp_path / "b"
    stale = tmp_path / ".b.partial-dead"
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    running = WorkFolder.create(output)  # a concurrent export of the same output: locked, kept
    other = tmp_path / ".c.partial-dead"  # another output's: not ours to remove
    other.mkdir()
    try:
        assert remove_stale_work_folders(output) == [stale]
        assert sorted(path.name for path in tmp_path.iterdir()) == sorted([running.path.name, ".c.partial-dead"])
    finally:
        running.remove()
    assert not running.path.exists()


def test_a_stop_while_the_work_folder_is_made_leaves_nothing(tmp_path, monkeypatch):
    """A signal that lands between the folder's creation and its handing over (the moment an export's watcher first
    sees the folder) removes it: the export had not yet reached the code that would."""
    from edge.export import workdir

    def interrupted(path, wait):
        raise KeyboardInterrupt

    monkeypatch.setattr(workdir, "_lock", interrupted)
    with pytest.raises(KeyboardInterrupt):
        WorkFolder.create(tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_an_export_work_folder_is_never_loaded(tmp_path):
    """Refused by its name, before anything in it is read (an export killed before its manifest was written)."""
    folder = tmp_path / ".model.bundle.partial-x1y2"
    (folder / "target").mkdir(parents=True)
    (folder / "target" / "model.onnx").write_bytes(b"not yet a graph")
    with pytest.raises(BundleError) as caught:
        Engine.load(folder)
    assert str(caught.value) == (f"{folder} is an unfinished edge-export (the export was stopped before it "
                                 f"validated the bundle), which is never loaded; export again to "
                                 f"{tmp_path / 'model.bundle'} (that removes this folder), or delete it")


def test_a_bundle_without_its_manifest_says_so_not_that_config_json_is_missing(tmp_path):
    folder = tmp_path / "copied.bundle"
    (folder / "target").mkdir(parents=True)
    (folder / "target" / "model.onnx").write_bytes(b"graph")
    (folder / "target" / "config.json").write_text("{}")
    with pytest.raises(BundleError) as caught:
        Engine.load(folder)
    message = str(caught.value)
    assert "holds an exported graph (target/model.onnx) but no manifest.json" in message
    assert "config.json" not in message and "\n" not in message


def test_a_pipe_as_calibration_text_is_refused_not_waited_on(llama_dir, tmp_path, capsys):
    from edge.export.cli import main as export_main

    os.mkfifo(tmp_path / "text")
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--calibration-text", str(tmp_path / "text"),
                        "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (f"edge-export: error: --calibration-text {tmp_path / 'text'} is a "
                                               "named pipe; pass a UTF-8 text file")
