"""Stage progress for edge-export: one bar per stage on stderr ("[3/7] quantizing the target (int4) [####----]")."""

from __future__ import annotations

import sys
import time


class StageProgress:
    def __init__(self, stages: int, enabled: bool = True, width: int = 24) -> None:
        self.stages, self.enabled, self.width = stages, enabled, width
        self.index, self.label, self.started = 0, "", time.perf_counter()
        self.tty = sys.stderr.isatty()

    def stage(self, label: str) -> None:
        self._finish()
        self.index += 1
        self.label, self.started = label, time.perf_counter()
        self.update(0.0)

    def update(self, fraction: float) -> None:
        if not self.enabled or not (self.tty or fraction == 0.0):
            return
        filled = int(max(0.0, min(1.0, fraction)) * self.width)
        line = f"[{self.index}/{self.stages}] {self.label} [{'#' * filled}{'-' * (self.width - filled)}]"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        sys.stderr.flush()

    def _finish(self) -> None:
        if self.enabled and self.index:
            if self.tty:
                self.update(1.0)
            elapsed = time.perf_counter() - self.started
            sys.stderr.write(f" {elapsed:.1f} s\n" if self.tty else f"[{self.index}/{self.stages}] done in "
                             f"{elapsed:.1f} s\n")
            sys.stderr.flush()

    def abort(self) -> None:
        """End the current stage's line without calling it done (it failed, or Ctrl+C stopped it)."""
        if self.enabled and self.index and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.index = 0

    def close(self) -> None:
        self._finish()
        self.index = 0
