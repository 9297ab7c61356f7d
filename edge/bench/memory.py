"""The memory plan against measured peak resident memory, one fresh process per method.

    python -m edge.bench.memory [MODEL] [--methods ar,ngram,early-exit:3,builtin] [--max-context 2048]

For each method a worker measures the process's resident memory once torch and edge are loaded and warmed up (the
runtime's own overhead), plans with a roomy budget, loads, answers five bench prompts, and reports its peak
resident memory (ru_maxrss). Predicted = runtime + the plan's footprint. Prints a Markdown table and JSON.
"""

from __future__ import annotations

import argparse
import json

from edge.bench.suite import run_child
from edge.cli_options import resolve_model_path

MiB = 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge.bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="checkpoint folder; default: the built-in model")
    parser.add_argument("--methods", default="ar,ngram,early-exit:3,builtin")
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)
    model = resolve_model_path(args.model)
    rows = []
    for method in args.methods.split(","):
        rows.append(run_child("edge.bench.memory_worker", ["--model", str(model), "--method", method,
                                                           "--max-context", str(args.max_context),
                                                           "--max-new-tokens", str(args.max_new_tokens)], method))
    print("| method | runtime MiB | plan MiB (weights + KV + speculation) | predicted peak MiB | measured peak MiB "
          "| measured / predicted | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        plan = row["footprint"]
        print(f"| {row['method']} | {row['runtime_rss'] / MiB:.0f} | {plan['total'] / MiB:.1f} "
              f"({plan['target_weights'] / MiB:.1f} + {plan['target_kv'] / MiB:.1f} + {plan['speculation'] / MiB:.1f})"
              f" | {row['predicted'] / MiB:.0f} | {row['peak_rss'] / MiB:.0f} | {row['peak_rss'] / row['predicted']:.3f}"
              f" | {row['tokens_per_s']:.0f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
