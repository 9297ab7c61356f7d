"""The one way a benchmark tool runs work in a child process (a memory measurement of its own, a CPU path chosen by
the environment, a llama-cpp-python build put first on the path): a JSON request in, a JSON result out.

    parent:  result = run_child("bench.suite_worker:measure", request, "ngram (k=2)")
    child:   python -m bench.process bench.suite_worker:measure    (started by run_child)
             reads the request from stdin, calls measure(request), prints json.dumps(result), and nothing else, on stdout

Anything else the work prints goes to stderr, so stdout carries the result alone. A child that exits with an error, runs
past its timeout or prints no result is one WorkerError naming the work and the end of its stderr; WorkerError is a
SystemExit, so a tool that does not catch it stops with that message.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Iterator

CHECKOUT = Path(__file__).resolve().parents[1]  # bench/ runs from a checkout: the child imports it from here
TIMEOUT_S = 6 * 3600  # a stuck child ends the tool instead of hanging it; a suite worker on a large model is hours
STDERR_TAIL = 2000  # characters of a failed child's stderr that its error quotes


class WorkerError(SystemExit):
    """A child process failed, timed out or printed no result; `last_line` is the last line of its stderr."""

    def __init__(self, message: str, stderr: str | bytes | None) -> None:
        text = (stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or "").strip()
        super().__init__(f"{message}:\n{text[-STDERR_TAIL:]}" if text else message)
        self.last_line = text.splitlines()[-1] if text else ""


def run_child(work: str, request: dict, label: str, *, prog: str = "edge-bench", timeout_s: float | None = TIMEOUT_S,
              env: dict[str, str] | None = None) -> Any:
    """Run `work` ("package.module:function") in a fresh python process on `request` and return its result.

    `env` adds to (or overrides) this process's environment; the checkout goes first on the child's PYTHONPATH.
    `label` names the work in errors ("edge-bench: ngram (k=2) failed (exit 1): ...")."""
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), environment.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, "-m", "bench.process", work], input=json.dumps(request),
                              capture_output=True, text=True, timeout=timeout_s, env=environment)
    except subprocess.TimeoutExpired as expired:
        raise WorkerError(f"{prog}: {label} did not finish within {timeout_s:.0f} s ({work}); it was stopped",
                          expired.stderr) from None
    if done.returncode != 0:
        raise WorkerError(f"{prog}: {label} failed (exit {done.returncode})", done.stderr)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise WorkerError(f"{prog}: {label} printed no result ({work})", done.stderr) from None


def serve(work: str) -> int:
    """The child's side: the request from stdin, `work`'s result as the one line of the real stdout. Everything else
    written to stdout, by python or by a C library, goes to stderr (file descriptor 1 points there meanwhile)."""
    module, _, name = work.partition(":")
    handle: Callable[[dict], Any] = getattr(import_module(module), name)
    request = json.load(sys.stdin)
    sys.stdout.flush()
    result_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    result = handle(request)
    result_stream.write(json.dumps(result) + "\n")
    result_stream.close()
    return 0


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (ru_maxrss, the kernel's high-water mark), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


if __name__ == "__main__":
    if len(sys.argv) != 2 or ":" not in sys.argv[1]:
        sys.exit("usage: python -m bench.process package.module:function  (a JSON request on stdin)")
    sys.exit(serve(sys.argv[1]))


@contextmanager
def busy_processes(count: int) -> Iterator[list[subprocess.Popen]]:
    """`count` processes that keep one core busy each (a spinning Python loop, as a browser tab or a build would) for
    as long as the block runs: what a laptop's other work does to a runtime's threads (edge-bench --background-load)."""
    children = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
                for _ in range(count)]
    try:
        yield children
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()
