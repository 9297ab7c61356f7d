"""python -m tests.fuzz [--seconds N] [--target NAME]: each fuzz target for N seconds (default 60) of fresh random
examples, in a pytest process of its own with its address space capped (tests/fuzz/harness.py). The exit status is
1 when a target found something: pytest's report shows the smallest failing example, and an example that ended its
process (a hang in C code, a crash) is shown from the record the harness keeps. A target marked xfail (a fault
known and being fixed) stops at its first failure and is listed as XFAIL."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"gguf": "test_gguf_headers.py", "requests": "test_requests.py", "chats": "test_chat_files.py",
           "templates": "test_chat_templates.py"}


def run_target(name: str, seconds: float) -> bool:
    """One target's run; whether it found nothing."""
    print(f"fuzz {name}: {seconds:g} s", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edge-fuzz-") as folder:
        record = Path(folder) / "example.txt"
        environment = {**os.environ, "EDGE_FUZZ_SECONDS": str(seconds), "EDGE_FUZZ_RECORD": str(record),
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-rxX", "-p", "no:cacheprovider", "-n", "0",
                                str(Path(__file__).parent / TARGETS[name])], cwd=ROOT, env=environment)
        last = record.read_text() if record.is_file() else ""
    if last.strip():
        print(f"fuzz {name}: the process ended inside this example: {last.strip()}", flush=True)
    print(f"fuzz {name}: {'no failure' if code == 0 else 'FOUND SOMETHING'} "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    return code == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each target runs (default 60)")
    parser.add_argument("--target", choices=sorted(TARGETS), action="append",
                        help="a target to run (repeat for several; default: every target)")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds {args.seconds:g}: pass a number of seconds above 0, such as 60")
    results = [run_target(name, args.seconds) for name in args.target or TARGETS]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
