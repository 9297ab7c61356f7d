"""The side panel: live speed and acceptance of the reply being generated, and memory: the plan against the process's
resident memory, what each means, and whether the gap between them is the usual one."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
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

    def reset_reply(self) -> None:
        """A new chat: no reply's figures (the drafter, draft length and baseline stay)."""
        self.figures.stats, self.figures.last_k = None, 0
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


GAP_SLACK = 64 * 2**20  # resident memory past plan + runtime that is still usual: buffers, allocator caches
GAP_SLACK_SHARE = 0.1  # ... and this share of the plan


def memory_verdict(planned: int, resident: int, runtime: int | None) -> tuple[str, str]:
    """Whether resident memory is what the plan leads one to expect, as (one line, style): the process held `runtime`
    bytes (Python, torch, the app) before the model loaded, so resident is about runtime + plan; more than that by
    over GAP_SLACK (and GAP_SLACK_SHARE of the plan) is unusual."""
    if resident <= planned:
        return "normal: within the plan", "green"
    if runtime is None:
        return f"gap {format_size(resident - planned)}: runtime and buffers", "dim"
    over = resident - planned - runtime
    if over <= GAP_SLACK + GAP_SLACK_SHARE * planned:
        return f"normal: runtime {format_size(runtime)} + plan", "green"
    return f"high: {format_size(over)} over runtime + plan", "yellow"


class MemoryBar(Static):
    """Planned bytes (weights, KV caches, drafter) and the process's resident memory, against the budget, with a
    legend and a verdict on the gap between the two (`memory_verdict`)."""

    def on_mount(self) -> None:
        self.border_title = "memory"

    def show(self, planned: int, used: int, budget: int | None, width: int = 20, *, runtime: int | None = None
             ) -> None:
        """`runtime`: the process's resident bytes before the model loaded (None: not measured)."""
        limit = budget or max(planned, used)
        filled = min(width, round(width * used / limit)) if limit else 0
        planned_mark = min(width, round(width * planned / limit)) if limit else 0
        bar = Text()
        bar.append("█" * min(filled, planned_mark), style="#5fafff")
        bar.append("█" * max(0, filled - planned_mark), style="#8787af" if used <= limit else "red")
        bar.append("░" * (width - max(filled, planned_mark)), style="dim")
        verdict, style = memory_verdict(planned, used, runtime)
        figures = Table.grid(padding=(0, 1))
        figures.add_column(style="dim")
        figures.add_column(justify="right")
        figures.add_row("plan", format_size(planned))
        figures.add_row("resident", format_size(used))
        figures.add_row("budget", format_size(budget) if budget else "none set")
        legend = Text("plan: weights + KV + drafter\nresident: RAM of the process", style="dim italic")
        self.update(Group(bar, figures, legend, Text(verdict, style=style)))
