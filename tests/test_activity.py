"""Other edge work on the machine, which the chat's speed baseline waits for (edge/activity.py)."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from edge import activity

SLEEPER = "import time; time.sleep(60)"
SPINNER = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"


@pytest.mark.parametrize(("command_line", "what"), [
    (["/usr/lib/gcc/x86_64-linux-gnu/12/cc1", "-O3", "/src/edge/kernels/csrc/layers.c"], activity.KERNEL_BUILD),
    (["cc", "-O3", "x.o", "-o", "/home/u/.cache/edge/kernels/tmpab12.so"], None),
    (["cc", "-shared", "avx2-layers.o", "-o", "/x/prebuilt/edge-kernel-avx2-0123.so"], activity.KERNEL_BUILD),
    (["/venv/bin/python", "/venv/bin/edge-bench", "--quick"], "edge-bench"),
    (["/venv/bin/edge-serve"], "edge-serve"),
    (["python", "-m", "bench.suite", "MODEL"], "python -m bench.suite"),
    (["python", "-m", "pytest", "-q"], None),
    (["vim", "edge-chat.md"], None),
    ([], None),
])
def test_edge_work_is_told_from_its_command_line(command_line, what):
    assert activity.describe(command_line) == what


def script(folder, name: str, code: str) -> subprocess.Popen:
    """A process whose command line is `python FOLDER/NAME`, as an installed edge command's is."""
    path = folder / name
    path.write_text(code)
    return subprocess.Popen([sys.executable, str(path)])


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.kill()
        process.wait()


def seeing_only(monkeypatch, *processes: subprocess.Popen) -> None:
    """other_edge_work sees these processes alone: the suite's other test processes run real edge commands."""
    pids, every = {process.pid for process in processes}, psutil.process_iter
    monkeypatch.setattr(psutil, "process_iter", lambda *args, **kwargs: (
        process for process in every(*args, **kwargs) if process.pid in pids))


def test_a_kernel_build_counts_at_once_and_an_idle_command_does_not(tmp_path, monkeypatch):
    build = subprocess.Popen([sys.executable, "-c", SLEEPER, "/src/edge/kernels/csrc/layers.c"])
    idle = script(tmp_path, "edge-serve", SLEEPER)
    seeing_only(monkeypatch, build, idle)
    try:
        found = activity.other_edge_work(sample_s=0.3)
        assert activity.KERNEL_BUILD in found and "edge-serve" not in found
    finally:
        stop(build, idle)


def test_a_busy_edge_command_counts_until_it_ends(tmp_path, monkeypatch):
    spinner = script(tmp_path, "edge-export", SPINNER)
    seeing_only(monkeypatch, spinner)
    try:
        assert "edge-export" in activity.other_edge_work(sample_s=0.3)
    finally:
        stop(spinner)
    assert "edge-export" not in activity.other_edge_work(sample_s=0.3)
