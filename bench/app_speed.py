"""Does the chat app slow decoding? The app in a real terminal against `edge-chat --prompt`, side by side.

    flock /tmp/edge-bench.lock python -m bench.app_speed --sizes 80x24,200x50 --repeats 5

Needs tmux. Each repeat runs, for every prompt, `edge-chat --prompt P --stats` (its tokens/s line) and then the app
(`edge-chat`, the same model, drafter and options) in a detached tmux window of each size: the prompt is typed, sent
with Enter, and the reply's decode speed read from the chat the app saves (the figure its side panel shows). Both
are the engine's decode tokens per second of decode-step time, so the ratio is like with like. It reports the median
of each and the app's share of --prompt's speed; the app passes at >= 95%.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.arguments import bench_parser

PROMPTS = {
    "markdown": "Write a README for a command-line tool in Markdown, with sections, nested lists and quotes.",
    "code": "Explain how Python dictionaries work, with examples.",
}
STATS_LINE = re.compile(r"[\[ ](\d+) tokens, ([\d.]+) tokens/s decoding")  # edge.tui.cli.stats_line
READY_TEXT = "Message · Enter sends"


def prompt_speed(edge_chat: list[str], prompt: str, options: list[str]) -> float:
    """tokens/s of `edge-chat --prompt` (its --stats line)."""
    done = subprocess.run([*edge_chat, *options, "--prompt", prompt, "--stats"], capture_output=True, text=True,
                          timeout=300, check=True)
    match = STATS_LINE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no stats line in edge-chat's output: {done.stdout[-300:]!r} {done.stderr[-300:]!r}")
    return float(match.group(2))


def app_speed(edge_chat: list[str], prompt: str, options: list[str], size: tuple[int, int]) -> float:
    """tokens/s the app measured for one reply in a tmux window of `size` (read from the chat it saved)."""
    data_dir = Path(tempfile.mkdtemp(prefix="edge-app-speed-"))
    window = f"edge-app-speed-{time.monotonic_ns()}"
    command = " ".join(["env", f"EDGE_DATA_DIR={data_dir}", *map(shell_quote, [*edge_chat, *options])])
    subprocess.run(["tmux", "new-session", "-d", "-s", window, "-x", str(size[0]), "-y", str(size[1]), command],
                   check=True)
    try:
        _wait(lambda: READY_TEXT in screen_text(window), 120, "the app to load")
        time.sleep(1.0)  # the loading screen's last frame and the first chat frame drawn
        subprocess.run(["tmux", "send-keys", "-t", window, "-l", prompt], check=True)
        subprocess.run(["tmux", "send-keys", "-t", window, "Enter"], check=True)
        reply = _wait(lambda: _saved_reply(data_dir), 300, "the reply")
        return float(reply["stats"]["tokens_per_s"])
    finally:
        subprocess.run(["tmux", "kill-session", "-t", window], check=False)
        shutil.rmtree(data_dir, ignore_errors=True)


def _saved_reply(data_dir: Path) -> dict | None:
    for path in (data_dir / "chats").glob("*.json"):
        try:
            messages = json.loads(path.read_text(encoding="utf-8"))["messages"]
        except (OSError, ValueError, KeyError):
            continue  # being written
        if messages and messages[-1]["role"] == "assistant" and "stats" in messages[-1]:
            return messages[-1]
    return None


def screen_text(window: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-t", window, "-p"], capture_output=True, text=True).stdout


def _wait(ready, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.app_speed", __doc__, repeats=5, max_new_tokens=512)
    parser.add_argument("--sizes", default="80x24,200x50", help="terminal sizes COLSxROWS, comma-separated")
    parser.add_argument("--prompts", default=",".join(PROMPTS), help=f"which of {', '.join(PROMPTS)}")
    parser.add_argument("options", nargs=argparse.REMAINDER,
                        help="more edge-chat options after --, the same for both (e.g. -- --drafter ngram)")
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("bench.app_speed: needs tmux (apt-get install tmux)", file=sys.stderr)
        return 2
    sizes = [tuple(int(n) for n in size.split("x")) for size in args.sizes.split(",")]
    edge_chat = [sys.executable, "-m", "edge.tui.cli"]
    options = ["--max-new-tokens", str(args.max_new_tokens), *[o for o in args.options if o != "--"]]
    results: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for name in args.prompts.split(","):
            runs = [("--prompt", lambda: prompt_speed(edge_chat, PROMPTS[name], options))]
            runs += [(f"app {w}x{h}", lambda size=(w, h): app_speed(edge_chat, PROMPTS[name], options, size))
                     for w, h in sizes]
            for mode, run in runs:
                speed = run()
                results.setdefault((name, mode), []).append(speed)
                print(f"repeat {repeat + 1} {name:9s} {mode:12s} {speed:8.1f} tokens/s", file=sys.stderr, flush=True)
    print(f"\n| prompt | mode | median tokens/s | runs | share of --prompt |\n|---|---|---:|---|---:|")
    for name in args.prompts.split(","):
        reference = statistics.median(results[(name, "--prompt")])
        for (prompt_name, mode), speeds in results.items():
            if prompt_name == name:
                median = statistics.median(speeds)
                print(f"| {name} | {mode} | {median:.1f} | {', '.join(f'{s:.0f}' for s in speeds)} | "
                      f"{median / reference:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
