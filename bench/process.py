"""The one way a benchmark tool runs work in a child process (a memory measurement of its own, a CPU path chosen by
the environment, a llama-cpp-python build put first on the path): a JSON request in, a JSON result out.

    parent:  result = run_child("bench.suite_worker:measure", request, "ngram (k=2)")
    child:   python -m bench.process bench.suite_worker:measure    (started by run_child)
             reads the request from stdin, calls measure(request), prints json.dumps(result), and nothing else, on stdout

Anything else the work prints goes to stderr, so stdout carries the result alone. A child that exits with an error, runs
past its timeout or prints no result is one WorkerError naming the work and the end of its stderr; WorkerError is a
SystemExit, so a tool that does not catch it stops with that message.

The work may report how far it got with `report_progress(done, total)`; the parent's `on_progress(done, total)`
receives each report as it is made (edge-bench's per-prompt progress and ETA).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import IO, Any, Callable, Iterator

CHECKOUT = Path(__file__).resolve().parents[1]  # bench/ runs from a checkout: the child imports it from here
TIMEOUT_S = 6 * 3600  # a stuck child ends the tool instead of hanging it; a suite worker on a large model is hours
STDERR_TAIL = 2000  # characters of a failed child's stderr that its error quotes
PROGRESS_MARK = "\x1eprogress "  # a stderr line that starts so is a progress report, not the work's own output


class WorkerError(SystemExit):
    """A child process failed, timed out or printed no result; `last_line` is the last line of its stderr."""

    def __init__(self, message: str, stderr: str | bytes | None) -> None:
        text = (stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or "").strip()
        super().__init__(f"{message}:\n{text[-STDERR_TAIL:]}" if text else message)
        self.last_line = text.splitlines()[-1] if text else ""


def run_child(work: str, request: dict, label: str, *, prog: str = "edge-bench", timeout_s: float | None = TIMEOUT_S,
              env: dict[str, str] | None = None, on_progress: Callable[[int, int], None] | None = None) -> Any:
    """Run `work` ("package.module:function") in a fresh python process on `request` and return its result.

    `env` adds to (or overrides) this process's environment; the checkout goes first on the child's PYTHONPATH.
    `label` names the work in errors ("edge-bench: ngram (k=2) failed (exit 1): ..."). `on_progress(done, total)` is
    called, on this thread, for each `report_progress` the work makes, as it makes it."""
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), environment.get("PYTHONPATH")]))
    child = subprocess.Popen([sys.executable, "-m", "bench.process", work], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                             env=environment)  # a C library may print bytes that are not UTF-8
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(child.stdout.read()), daemon=True)
    reader.start()
    timed_out = threading.Event()
    timer = threading.Timer(timeout_s, lambda: (timed_out.set(), child.kill())) if timeout_s is not None else None
    if timer is not None:
        timer.start()
    try:
        with contextlib.suppress(BrokenPipeError):  # a child that died at once: its stderr says why
            child.stdin.write(json.dumps(request))
            child.stdin.close()
        stderr = _read_stderr(child.stderr, on_progress)
        child.wait()
        reader.join()
    finally:
        if timer is not None:
            timer.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
    if timed_out.is_set():
        raise WorkerError(f"{prog}: {label} did not finish within {timeout_s:.0f} s ({work}); it was stopped", stderr)
    if child.returncode != 0:
        raise WorkerError(f"{prog}: {label} failed (exit {child.returncode})", stderr)
    try:
        return json.loads(stdout[0] if stdout else "")
    except json.JSONDecodeError:
        raise WorkerError(f"{prog}: {label} printed no result ({work})", stderr) from None


def _read_stderr(stream: IO[str], on_progress: Callable[[int, int], None] | None) -> str:
    """The child's stderr as it comes: progress reports to `on_progress`, everything else kept and returned."""
    kept = []
    for line in stream:
        if line.startswith(PROGRESS_MARK):
            if on_progress is not None:
                done, total = json.loads(line[len(PROGRESS_MARK):])
                on_progress(done, total)
        else:
            kept.append(line)
    return "".join(kept)


def report_progress(done: int, total: int) -> None:
    """The child's side: `done` of `total` units of its work are finished (run_child's on_progress gets them)."""
    sys.stderr.write(f"{PROGRESS_MARK}{json.dumps([done, total])}\n")
    sys.stderr.flush()


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
