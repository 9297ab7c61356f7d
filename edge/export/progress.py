"""Stage progress for edge-export through rich, on stderr: one bar per stage ("[3/7] quantizing the target (int4)
━━━━━━╺━━━━ 0:00:12") while a terminal shows it; in a log or a pipe, one plain line when a stage starts and one when
it ends ("[3/7] done in 12.0 s"), so a long export still says where it is. `enabled=False` (--quiet): nothing."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class StageProgress:
    def __init__(self, stages: int, enabled: bool = True, console: Console | None = None) -> None:
        self.stages, self.enabled = stages, enabled
        self.console = console or Console(stderr=True)
        self.live = enabled and self.console.is_terminal  # the moving bars; else the plain lines
        self.bars = Progress(TextColumn("{task.description}", markup=False), BarColumn(), TimeElapsedColumn(),
                             console=self.console, disable=not self.live)
        self.index, self.started = 0, time.perf_counter()
        self.task: TaskID | None = None

    def stage(self, label: str) -> None:
        self._finish()
        if self.index == 0:
            self.bars.start()
        self.index += 1
        self.started = time.perf_counter()
        self.task = self.bars.add_task(f"[{self.index}/{self.stages}] {label}", total=1.0)
        self._line(f"[{self.index}/{self.stages}] {label}")

    def update(self, fraction: float) -> None:
        if self.task is not None:
            self.bars.update(self.task, completed=max(0.0, min(1.0, fraction)))

    def _finish(self) -> None:
        if self.task is not None:
            self.bars.update(self.task, completed=1.0)
            self._line(f"[{self.index}/{self.stages}] done in {time.perf_counter() - self.started:.1f} s")
            self.task = None

    def _line(self, text: str) -> None:
        if self.enabled and not self.live:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def abort(self) -> None:
        """End the current stage without calling it done (it failed, or Ctrl+C stopped it)."""
        self.task = None
        self.close()

    def close(self) -> None:
        self._finish()
        self.bars.stop()
        self.index = 0
