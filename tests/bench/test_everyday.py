"""bench.everyday's smoke test on the built-in model: two prompts, a few tokens, both settings, loops counted."""

from __future__ import annotations

import io

from bench.everyday import PROMPTS, run
from edge import Engine
from edge.sources.builtin import builtin_model_path


def test_everyday_counts_loops_under_the_old_and_the_new_defaults():
    assert len(PROMPTS) == 30 and len({name for name, _ in PROMPTS}) == 30
    out = io.StringIO()
    replies = run(Engine.load(builtin_model_path(), max_context=256), ["old", "new"], 1, 16, PROMPTS[:2], out)
    assert [(r.prompt, r.setting) for r in replies] == [("capital", "old"), ("capital", "new"),
                                                        ("translate", "old"), ("translate", "new")]
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("capital") and "old:" in lines[0] and "new[0]:" in lines[0]
    assert lines[-2].startswith("old: ") and lines[-1].startswith("new: ") and "replies loop" in lines[-1]
