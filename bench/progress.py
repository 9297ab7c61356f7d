"""edge-bench's progress on stderr: which pass and method runs, how many of its prompts are done, and an estimate of
the time the whole run has left: the time per prompt since the first one finished (later model loads included), times
the prompts still to run; until a second one finishes, the time so far per prompt (the first load and warm-up
included, so that first estimate runs high).

    edge-bench: pass 1/2: ar  3/7 prompts  ETA 0:24

On a terminal the line is rewritten in place; elsewhere (a log, a pipe) each update is a line of its own.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


def clock_text(seconds: float) -> str:
    """0:24, 12:05, 1:02:03."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RunProgress:
    """A run of `total` prompt runs (passes x methods x prompts), reported as each finishes."""

    def __init__(self, total: int, *, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 prog: str = "edge-bench") -> None:
        self.total, self.stream, self.clock, self.prog = total, stream or sys.stderr, clock, prog
        self.started = clock()
        self.done = 0  # prompt runs finished in the whole run
        self.step_done = 0  # ... in the current step (one method in one pass)
        self.label = ""
        self._first: tuple[float, int] | None = None  # (when, prompts done) at the first finished prompt
        self.in_place = self.stream.isatty()
        self._open_line = False

    def eta(self) -> float | None:
        """Seconds the run has left, by the time per prompt run (see the module's note); None before one finished."""
        if not self.done:
            return None
        now = self.clock()
        if self._first is None:
            self._first = (now, self.done)
        since, done_then = self._first
        if self.done > done_then:
            return (now - since) / (self.done - done_then) * (self.total - self.done)
        return (now - self.started) / self.done * (self.total - self.done)

    def step(self, label: str) -> Callable[[int, int], None]:
        """A new step (e.g. "pass 1/2: ar") starts; returns what its worker's progress reports go to."""
        self.label, self.step_done = label, 0
        self._write(f"{label} ...")
        return self.update

    def update(self, done: int, total: int) -> None:
        """`done` of the step's `total` prompts are finished."""
        self.done += done - self.step_done
        self.step_done = done
        eta = self.eta()
        self._write(f"{self.label}  {done}/{total} prompts  ETA {clock_text(eta) if eta is not None else '-'}")

    def close(self) -> None:
        """The run ended: the line in place is finished, with the time the run took."""
        self._write(f"done in {clock_text(self.clock() - self.started)}")
        if self.in_place and self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False

    def _write(self, text: str) -> None:
        line = f"{self.prog}: {text}"
        if self.in_place:
            self.stream.write(f"\r{line}\x1b[K")
            self._open_line = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
