"""The developer tools' entry points: bench/ runs from a checkout of edge's repository and is not installed (nothing
but `edge` goes into site-packages), so `edge-bench` finds it beside the installed package, which an editable install
(`pip install -e .`, the README's) keeps in the checkout."""

from __future__ import annotations

import sys
from importlib import import_module
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # edge/frontend/ -> the repository, for an editable install


def edge_bench() -> int | None:
    """`edge-bench`: bench.cli.main from the checkout this edge was installed from."""
    if not (CHECKOUT / "bench" / "cli.py").is_file():
        sys.exit("edge-bench: bench/ is a developer tool that runs from a checkout of edge's repository; clone it, "
                 "run `pip install -e .` there, and run edge-bench from that environment")
    sys.path.insert(0, str(CHECKOUT))
    return import_module("bench.cli").main()
