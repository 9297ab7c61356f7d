"""The chat app's provenance colours (apart in every colour depth a terminal has) and the memory panel's verdict."""

from __future__ import annotations

import pytest
from rich.color import Color, ColorSystem
from rich.terminal_theme import DEFAULT_TERMINAL_THEME

from edge.tui.widgets.message import DRAFTED_STYLE, TARGET_STYLE
from edge.tui.widgets.stats import GAP_SLACK, memory_verdict

MiB = 2**20


def lab(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    """sRGB -> CIE L*a*b* (D65)."""
    def linear(channel: int) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = map(linear, rgb)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    f = lambda t: t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116  # noqa: E731
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def delta_e(first: tuple[int, int, int], second: tuple[int, int, int]) -> float:
    return sum((p - q) ** 2 for p, q in zip(lab(first), lab(second))) ** 0.5


@pytest.mark.parametrize("system", [ColorSystem.TRUECOLOR, ColorSystem.EIGHT_BIT, ColorSystem.STANDARD])
def test_drafted_and_target_colours_are_far_apart_in_every_colour_depth(system):
    shown = [Color.parse(style).downgrade(system) for style in (DRAFTED_STYLE, TARGET_STYLE)]
    rgb = [tuple(colour.get_truecolor(DEFAULT_TERMINAL_THEME)) for colour in shown]
    assert delta_e(*rgb) > 80  # far past "hard to tell apart" (the green and pale yellow of before: 46)
    if system is ColorSystem.EIGHT_BIT:  # palette entries: a 256-colour terminal shows the truecolor ones exactly
        assert rgb == [tuple(Color.parse(style).get_truecolor()) for style in (DRAFTED_STYLE, TARGET_STYLE)]


def test_memory_verdict_says_whether_the_gap_is_the_runtimes():
    plan, runtime = 280 * MiB, 243 * MiB
    assert memory_verdict(plan, 200 * MiB, runtime) == ("normal: within the plan", "green")
    text, style = memory_verdict(plan, 567 * MiB, runtime)  # the default model: 287 MiB over the plan
    assert style == "green" and text == "normal: runtime 243 MiB + plan"
    text, style = memory_verdict(plan, plan + runtime + GAP_SLACK + 100 * MiB, runtime)
    assert style == "yellow" and text.startswith("high: ") and "over runtime + plan" in text
    assert memory_verdict(plan, 567 * MiB, None)[0] == "gap 287 MiB: runtime and buffers"
