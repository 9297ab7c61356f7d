"""The training runs' progress through rich, on stderr: steps, rate, ETA, the latest values (loss) and a note on one
line. A terminal shows the bar moving; a log or a pipe gets the same line in plain text every 30 s and at the end."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as Bars

LOG_EVERY_S = 30.0  # off a terminal: one line this often


class Progress:
    def __init__(self, total: int, start: int = 0, label: str = "", console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.bars = Bars(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                         TextColumn("{task.fields[rate]}"), TextColumn("eta"), TimeRemainingColumn(),
                         TextColumn("{task.fields[values]} {task.fields[note]}", markup=False),
                         console=self.console, disable=not self.console.is_terminal)
        self.task = self.bars.add_task(label, total=total, completed=start, rate="", values="", note="")
        self._last_line = time.perf_counter()
        self.bars.start()

    def update(self, step: int, **values: float) -> None:
        self.bars.update(self.task, completed=step,
                         values=" ".join(f"{name} {value:.4f}" for name, value in values.items()))
        speed = self.bars.tasks[0].speed
        self.bars.update(self.task, rate=f"{speed:.2f} it/s" if speed else "")
        now = time.perf_counter()
        if self.bars.disable and (now - self._last_line >= LOG_EVERY_S or step >= self.bars.tasks[0].total):
            self._last_line = now
            self.console.print(self.bars.make_tasks_table(self.bars.tasks), soft_wrap=True)

    def note(self, text: str) -> None:
        self.bars.update(self.task, note=text)

    def close(self) -> None:
        self.bars.stop()
