"""How long a new user waits for a chat: seconds from starting `edge-chat` (the README's first command: no model
named, the default model) in a terminal to its chat screen.

    python -m bench.ready_time --repeats 3
    python -m bench.ready_time --repeats 3 -- --drafter ngram        # more edge-chat options after --

Needs tmux. Each run starts `edge-chat` (its installed script, as a user runs it) in a detached tmux window of 80x24
and reads the window every 20 ms until the chat's input line is drawn ("Message · Enter sends"), so Python's
start-up, the imports, the model's load and the first frames all count. The first run after an install also pays its
one-time costs (bytecode compiled, a GGUF file's settings read into the cache), which later runs do not.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.app_speed import READY_TEXT, screen_text, shell_quote
from bench.arguments import bench_parser

POLL_S = 0.02
TIMEOUT_S = 300


def seconds_to_ready(edge_chat: str, options: list[str]) -> float:
    """One run: from the window's start to the chat's input line on its screen."""
    data_dir = Path(tempfile.mkdtemp(prefix="edge-ready-time-"))
    window = f"edge-ready-time-{time.monotonic_ns()}"
    command = " ".join(["env", f"EDGE_DATA_DIR={data_dir}", *map(shell_quote, [edge_chat, *options])])
    started = time.perf_counter()
    subprocess.run(["tmux", "new-session", "-d", "-s", window, "-x", "80", "-y", "24", command], check=True)
    try:
        while READY_TEXT not in screen_text(window):
            if time.perf_counter() - started > TIMEOUT_S:
                raise RuntimeError(f"no chat within {TIMEOUT_S} s; the window shows:\n{screen_text(window)}")
            time.sleep(POLL_S)
        return time.perf_counter() - started
    finally:
        subprocess.run(["tmux", "kill-session", "-t", window], check=False)
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.ready_time", __doc__, repeats=3)
    parser.add_argument("options", nargs=argparse.REMAINDER, help="more edge-chat options after --")
    args = parser.parse_args(argv)
    edge_chat = shutil.which("edge-chat", path=str(Path(sys.executable).parent))
    if shutil.which("tmux") is None or edge_chat is None:
        print("bench.ready_time: needs tmux (apt-get install tmux) and edge-chat installed beside this Python",
              file=sys.stderr)
        return 2
    options = [option for option in args.options if option != "--"]
    times = []
    for run in range(1, args.repeats + 1):
        times.append(seconds_to_ready(edge_chat, options))
        print(f"run {run}: chat ready {times[-1]:.2f} s after edge-chat started", flush=True)
    print(f"median {statistics.median(times):.2f} s over {len(times)} runs (the first {times[0]:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
