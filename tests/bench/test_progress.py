"""bench.progress: edge-bench's per-pass progress line and its estimate of the time left."""

from __future__ import annotations

import io

from bench.progress import RunProgress, clock_text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_clock_text():
    assert [clock_text(s) for s in (0, 24.4, 65, 3723)] == ["0:00", "0:24", "1:05", "1:02:03"]


def test_each_finished_prompt_is_a_line_with_the_pass_the_method_and_the_time_left():
    out, clock = io.StringIO(), Clock()
    progress = RunProgress(2 * 2 * 3, stream=out, clock=clock)  # 2 passes x 2 methods x 3 prompts
    report = progress.step("pass 1/2: ar")
    clock.now += 6
    report(1, 3)  # 1 of 12 in 6 s (a load and a warm-up among them): 11 left at 6 s each
    clock.now += 3
    report(2, 3)  # since the first: 1 in 3 s, 10 left
    clock.now += 3
    report(3, 3)
    report = progress.step("pass 1/2: ngram (k=adaptive)")
    clock.now += 3
    report(1, 3)  # since the first: 3 in 9 s, 8 left
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "edge-bench: pass 1/2: ar ..."
    assert lines[1] == "edge-bench: pass 1/2: ar  1/3 prompts  ETA 1:06"
    assert lines[2] == "edge-bench: pass 1/2: ar  2/3 prompts  ETA 0:30"
    assert lines[5] == "edge-bench: pass 1/2: ngram (k=adaptive)  1/3 prompts  ETA 0:24"
    assert lines[-1] == "edge-bench: done in 0:15"


def test_on_a_terminal_the_line_is_rewritten_in_place():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, clock = Terminal(), Clock()
    progress = RunProgress(2, stream=out, clock=clock)
    report = progress.step("pass 1/1: ar")
    clock.now += 3
    report(1, 2)
    progress.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, finished at the end
    assert "\redge-bench: pass 1/1: ar  1/2 prompts  ETA 0:03\x1b[K" in text
