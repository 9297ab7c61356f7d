"""edge-export's stage progress (rich): bars on a terminal; plain start and done lines in a log; nothing when quiet."""

from __future__ import annotations

import io

from rich.console import Console

from edge.export.progress import StageProgress


def run_stages(console: Console, enabled: bool = True, fail: bool = False) -> None:
    progress = StageProgress(2, enabled=enabled, console=console)
    progress.stage("reading the checkpoint [config.json]")
    progress.update(0.5)
    progress.stage("building the target (int4)")
    if fail:
        progress.abort()
    progress.close()


def test_a_log_gets_one_line_as_each_stage_starts_and_ends():
    log = io.StringIO()
    run_stages(Console(file=log, force_terminal=False))
    lines = log.getvalue().splitlines()
    assert lines[0] == "[1/2] reading the checkpoint [config.json]" and lines[1].startswith("[1/2] done in ")
    assert lines[2] == "[2/2] building the target (int4)" and lines[3].startswith("[2/2] done in ") and len(lines) == 4


def test_a_failed_stage_is_not_called_done():
    log = io.StringIO()
    run_stages(Console(file=log, force_terminal=False), fail=True)
    assert log.getvalue().splitlines()[-1] == "[2/2] building the target (int4)"


def test_a_terminal_gets_the_bars_and_quiet_gets_nothing():
    screen = io.StringIO()
    run_stages(Console(file=screen, force_terminal=True, width=100))
    assert "[2/2] building the target (int4)" in screen.getvalue() and "━" in screen.getvalue()
    quiet = io.StringIO()
    run_stages(Console(file=quiet, force_terminal=True), enabled=False)
    assert quiet.getvalue() == ""
