"""The side panel: live speed and acceptance of the reply being generated, and memory plan against use."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from edge.events import Stats
from edge.memory.budget import format_size


@dataclass
class LiveFigures:
    drafter: str = "none"
    draft_length: str = "adaptive"
    baseline_tokens_per_s: float | None = None  # measured plain decoding on this machine
    measuring: bool = False  # the baseline is wanted and not measured yet
    stats: Stats | None = None
    last_k: int = 0  # tokens drafted per step lately


class StatsPanel(Static):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.figures = LiveFigures()

    def on_mount(self) -> None:
        self.border_title = "speculation"
        self.refresh_figures()

    def show(self, stats: Stats | None = None, *, last_k: int | None = None, **figures) -> None:
        for name, value in figures.items():
            setattr(self.figures, name, value)
        if stats is not None:
            self.figures.stats = stats
        if last_k is not None:
            self.figures.last_k = last_k
        self.refresh_figures()

    @property
    def speedup(self) -> float | None:
        """Decode speed of the latest reply over the measured plain-decoding speed."""
        stats, baseline = self.figures.stats, self.figures.baseline_tokens_per_s
        return stats.tokens_per_s / baseline if stats and stats.decode_s and baseline else None

    def refresh_figures(self) -> None:
        f, s = self.figures, self.figures.stats
        table = Table.grid(padding=(0, 1))
        table.add_column(style="dim")
        table.add_column(justify="right")
        table.add_row("drafter", f.drafter)
        length = f.draft_length if f.draft_length != "adaptive" else f"auto, k={f.last_k}" if f.last_k else "auto"
        table.add_row("draft length", length if f.drafter != "none" else "-")
        table.add_row("tokens/s", f"{s.tokens_per_s:.1f}" if s and s.decode_s else "-")
        baseline = f.baseline_tokens_per_s
        unknown = "measuring" if f.measuring and not baseline else "-"
        table.add_row("plain tok/s", f"{baseline:.1f}" if baseline else unknown)
        speedup = self.speedup
        table.add_row("speedup", Text(f"{speedup:.2f}x", style="bold") if speedup else unknown)
        table.add_row("accepted", f"{s.acceptance_rate:.0%}" if s and s.drafted else "-")
        table.add_row("tokens/step", f"{s.mean_accepted_tokens:.2f}" if s and s.steps else "-")
        table.add_row("tokens", f"{s.generated_tokens}" if s else "-")
        self.update(table)


class MemoryBar(Static):
    """Planned bytes (weights, KV caches, drafter) and the process's resident memory, against the budget."""

    def on_mount(self) -> None:
        self.border_title = "memory"

    def show(self, planned: int, used: int, budget: int | None, width: int = 20) -> None:
        limit = budget or max(planned, used)
        filled = min(width, round(width * used / limit)) if limit else 0
        planned_mark = min(width, round(width * planned / limit)) if limit else 0
        bar = Text()
        bar.append("█" * min(filled, planned_mark), style="#5fafff")
        bar.append("█" * max(0, filled - planned_mark), style="#8787af" if used <= limit else "red")
        bar.append("░" * (width - max(filled, planned_mark)), style="dim")
        lines = Text.assemble(bar, "\n",
                              ("plan ", "dim"), format_size(planned), ("  use ", "dim"), format_size(used), "\n",
                              ("budget ", "dim"), format_size(budget) if budget else "none set")
        self.update(lines)
