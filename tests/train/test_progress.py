"""train's progress line (rich): steps, rate, ETA, the latest loss and the note; plain text in a log."""

from __future__ import annotations

import io

from rich.console import Console

from train.progress import Progress


def test_a_log_gets_the_line_at_the_end_in_plain_text():
    log = io.StringIO()
    progress = Progress(4, start=1, label="drafter", console=Console(file=log, force_terminal=False, width=200))
    progress.note("agreement 0.91 [top-1]")
    for step in range(2, 5):
        progress.update(step, loss=1.5)
    progress.close()
    line = log.getvalue().strip()
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("drafter") and "4/4" in line and "it/s" in line and "eta" in line
    assert line.endswith("loss 1.5000 agreement 0.91 [top-1]")


def test_a_terminal_gets_a_moving_bar():
    screen = io.StringIO()
    progress = Progress(3, label="replies", console=Console(file=screen, force_terminal=True, width=120))
    progress.update(3)
    progress.close()
    assert "replies" in screen.getvalue() and "3/3" in screen.getvalue()
