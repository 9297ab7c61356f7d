"""Other edge work running on this machine, so that a speed measurement can wait for it: a build of edge's CPU
kernels (a compiler reading edge/kernels/csrc, at install or at run time), or one of edge's commands (edge-chat,
edge-serve, edge-bench, edge-export, `python -m edge.…`, `-m bench.…`, `-m train.…`) while it uses the CPU. An idle
edge-serve or chat window does not count; this process does not either."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

COMMANDS = frozenset({"edge", "edge-chat", "edge-serve", "edge-bench", "edge-export"})
MODULES = frozenset({"edge", "bench", "train"})  # python -m's top-level packages in a checkout of edge
KERNEL_BUILD = "a build of edge's CPU kernels"
BUSY_SHARE = 0.2  # of one core over the sample: a command using less is waiting (for a request, for its user)


def describe(command_line: list[str]) -> str | None:
    """What edge work a process's command line is, or None for anything else."""
    if any("kernels/csrc/" in arg or "edge-kernel-" in arg for arg in command_line):
        return KERNEL_BUILD  # the compiler driver and its cc1 children both name a source or an output
    for arg in command_line[:2]:  # the script itself, or python running it
        if Path(arg).name in COMMANDS:
            return Path(arg).name
    if "-m" in command_line[:-1]:
        module = command_line[command_line.index("-m") + 1]
        if module.split(".")[0] in MODULES:
            return f"python -m {module}"
    return None


def other_edge_work(sample_s: float = 0.5) -> list[str]:
    """The edge work running beside this process: every kernel build, and each edge command that used at least
    BUSY_SHARE of a core over `sample_s` seconds. Empty when the machine is free of edge's work."""
    found: dict[psutil.Process, str] = {}
    for process in psutil.process_iter(["cmdline"]):
        if process.pid == os.getpid():
            continue
        what = describe(process.info.get("cmdline") or [])
        if what is not None:
            found[process] = what
    builds = [what for what in found.values() if what == KERNEL_BUILD]
    commands = {process: _cpu_seconds(process) for process, what in found.items() if what != KERNEL_BUILD}
    if not commands:
        return builds[:1]
    time.sleep(sample_s)
    busy = [found[process] for process, before in commands.items()
            if before is not None and (_cpu_seconds(process) or 0.0) - before >= BUSY_SHARE * sample_s]
    return builds[:1] + sorted(set(busy))


def _cpu_seconds(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return times.user + times.system
