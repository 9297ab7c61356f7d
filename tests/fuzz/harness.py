"""What the fuzz targets share: their hypothesis settings, the run (the test suite's quick pass, or batches of fresh
examples for EDGE_FUZZ_SECONDS), each example's limits (time; address space in long runs) and the one property
they all check: a result, or edge's own one-line error.

EDGE_FUZZ_SECONDS unset: the quick pass, QUICK_EXAMPLES examples a target, the same ones every run, no example
database. Set (`python -m tests.fuzz` sets it): batches of fresh random examples until that many seconds have
passed, failures kept in an example database outside the repository (EDGE_FUZZ_DATABASE, default the user's cache
folder), so that the next long run tries them first.
"""

from __future__ import annotations

import faulthandler
import os
import resource
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import psutil
from hypothesis import HealthCheck, event, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.strategies import SearchStrategy

from edge.errors import EdgeError

SECONDS = float(os.environ.get("EDGE_FUZZ_SECONDS") or 0)  # 0: the test suite's quick pass
QUICK_EXAMPLES = 8
FIRST_BATCH, MAX_BATCH = 10, 1000  # a long run's batches of fresh random examples
MEMORY_MIB = int(os.environ.get("EDGE_FUZZ_MEMORY_MIB") or 4096)  # the address space a long run may add
HARD_LIMIT_FACTOR = 3  # past this many times an example's limit, the process ends (C code that ignores signals)


class ExampleTimeout(Exception):
    """An example ran past its time limit."""


def fuzz_settings(examples: int = QUICK_EXAMPLES) -> settings:
    common = dict(deadline=None, suppress_health_check=list(HealthCheck))
    if not SECONDS:
        return settings(max_examples=QUICK_EXAMPLES, derandomize=True, database=None, **common)
    return settings(max_examples=examples, database=_database(), print_blob=True, **common)


def _database() -> DirectoryBasedExampleDatabase:
    from platformdirs import user_cache_dir

    folder = os.environ.get("EDGE_FUZZ_DATABASE") or Path(user_cache_dir("edge", appauthor=False)) / "fuzz-examples"
    return DirectoryBasedExampleDatabase(folder)


def run(example: Callable[..., None], **strategies: SearchStrategy) -> None:
    """Run `example` on the values hypothesis draws from `strategies`: QUICK_EXAMPLES of them (the quick pass), or
    batch after batch of fresh ones until SECONDS have passed, each batch sized by the last one's pace to end near
    that time."""
    end, examples = time.monotonic() + SECONDS, FIRST_BATCH
    while True:
        started = time.monotonic()
        fuzz_settings(examples)(given(**strategies)(example))()
        left = end - time.monotonic()
        if left <= 0:
            return
        pace = (time.monotonic() - started) / examples
        examples = max(1, min(MAX_BATCH, int(left / max(pace, 1e-3)) + 1))


def cap_memory() -> None:
    """In a long run, cap this process's address space at what it holds now plus MEMORY_MIB: an example that
    allocates without bound then fails (MemoryError, or torch's allocation error) rather than taking the machine."""
    if not SECONDS:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = psutil.Process().memory_info().vms + MEMORY_MIB * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _record(example: object | None) -> None:
    """The running example, in the file EDGE_FUZZ_RECORD names (emptied when it ends): what a process ended past
    the hard limit, or by a crash, was running (`python -m tests.fuzz` shows it)."""
    path = os.environ.get("EDGE_FUZZ_RECORD")
    if path:
        Path(path).write_text("" if example is None else repr(example)[:4000] + "\n")


@contextmanager
def limited(seconds: float, example: object) -> Iterator[None]:
    """Run one example within `seconds`: past them an ExampleTimeout is raised in this thread (which stops Python
    code), and the example fails even where the code under test caught it; past HARD_LIMIT_FACTOR times that (C code
    that holds on), faulthandler prints every thread's stack and ends the process."""
    expired = []

    def expire(signum, frame) -> None:
        expired.append(True)
        raise ExampleTimeout(f"the example ran past its {seconds:g} s limit")

    _record(example)
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(HARD_LIMIT_FACTOR * seconds, exit=True)
    try:
        yield
    except BaseException as error:
        if expired and not isinstance(error, ExampleTimeout):
            raise ExampleTimeout(f"the example ran past its {seconds:g} s limit (then raised {error!r})") from error
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()
        _record(None)
    if expired:
        raise ExampleTimeout(f"the example ran past its {seconds:g} s limit (and its code went on)")


@contextmanager
def result_or_refusal() -> Iterator[None]:
    """The property every target checks: the code under test returns, or raises one of edge's own errors
    (edge.errors.EdgeError) on one line. Anything else propagates and fails the example."""
    try:
        yield
    except EdgeError as error:
        message = str(error)
        assert message.strip() and "\n" not in message, f"{type(error).__name__} not on one line: {message!r}"
        event(f"refused: {type(error).__name__}")
