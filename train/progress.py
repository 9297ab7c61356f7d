"""A dependency-free progress bar for long runs: steps, rate, ETA and the latest loss on one line (stderr)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, start: int = 0, label: str = "", width: int = 28) -> None:
        self.total, self.start, self.label, self.width = total, start, label, width
        self.started = time.perf_counter()
        self.last_note = ""
        self.tty = sys.stderr.isatty()
        self._last_print = 0.0

    def update(self, step: int, **values: float) -> None:
        now = time.perf_counter()
        if now - self._last_print < (0.5 if self.tty else 30.0) and step < self.total:
            return
        self._last_print = now
        done = step / self.total
        rate = (step - self.start) / max(now - self.started, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("inf")
        bar = "#" * int(done * self.width) + "-" * (self.width - int(done * self.width))
        fields = " ".join(f"{name} {value:.4f}" for name, value in values.items())
        line = f"{self.label} [{bar}] {step}/{self.total} {rate:.2f} it/s eta {eta / 60:.1f} min {fields} {self.last_note}"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        sys.stderr.flush()

    def note(self, text: str) -> None:
        self.last_note = text

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")

