"""The command-line options bench's tools share, declared once: every tool's parser comes from `bench_parser`,
which adds the shared options a tool names, with that tool's default, before the tool adds its own.

    parser = bench_parser("python -m bench.memory", __doc__, model=CHECKPOINT_HELP, max_new_tokens=128,
                          methods="ar,ngram,early-exit:3,builtin", json={"help": "write the measurements here"})
    parser.add_argument("--naive", ...)                   # what only this tool takes

A shared option's value in the call is its default, or a dict of argparse keywords (default, help, choices, type)
where a tool says more than the shared help. The model, drafter, sampling and memory options of the front ends
(edge-chat, edge-serve, edge-bench's model) are edge.frontend.options'; these are the benchmarks' own.
"""

from __future__ import annotations

import argparse
from typing import Any

CHECKPOINT_HELP = "checkpoint folder; default: the built-in model"

SHARED: dict[str, tuple[str, dict[str, Any]]] = {  # keyword -> (flag, argparse keywords every tool gets)
    "max_new_tokens": ("--max-new-tokens", {"type": int, "help": "tokens per reply"}),
    "repeats": ("--repeats", {"type": int, "help": "timed repeats; medians are reported"}),
    "methods": ("--methods", {"help": "comma-separated methods: ar (plain decoding) and drafter specs"}),
    "weights": ("--weights", {"help": "edge's target weights: quantize at load (int8, int4)"}),
    "kv_cache": ("--kv-cache", {"help": "KV cache format for every method (default: each method's own)"}),
    "dtype": ("--dtype", {"help": "compute dtype"}),
    "context": ("--context", {"type": int, "help": "tokens of context"}),
    "max_context": ("--max-context", {"type": int, "help": "the context every engine is loaded for"}),
    "tokens": ("--tokens", {"type": int, "help": "tokens to use"}),
    "drafter": ("--drafter", {"help": "the drafter (a spec edge takes)"}),
    "threads": ("--threads", {"type": int, "help": "CPU threads"}),
    "seed": ("--seed", {"type": int, "help": "random seed"}),
    "json": ("--json", {"help": "also write the results to this file (JSON)"}),
}


def bench_parser(prog: str, doc: str | None, *, model: str | None = None, **shared: Any) -> argparse.ArgumentParser:
    """`prog`'s parser, described by the first paragraph of `doc`: an optional MODEL first when `model` (its help)
    is given, then the shared options named in `shared` (SHARED's keywords), each with the tool's default or
    argparse keywords."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0] if doc else None)
    if model is not None:
        parser.add_argument("model", nargs="?", help=model)
    for name, value in shared.items():
        flag, keywords = SHARED[name]
        parser.add_argument(flag, **{**keywords, **(value if isinstance(value, dict) else {"default": value})})
    return parser

