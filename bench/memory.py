"""The memory plan against measured peak resident memory, one fresh process per method.

    python -m bench.memory [MODEL] [--methods ar,ngram,early-exit:3,builtin,builtin+ctx256] [--max-context 2048]

A method is a drafter spec (or `ar`), optionally with `+ctxN` (a draft model with its own N-token cache) and
`+bf16` (its weights stored in bfloat16).

For each method a worker measures the process's resident memory once torch and edge are loaded and warmed up (the
runtime's own overhead), plans with a roomy budget, loads, answers five bench prompts, and reports its peak
resident memory (ru_maxrss), and what is resident once loaded and once it has answered (over the runtime's own: the
model, its cache, its tokenizer and buffers). Predicted = runtime + the plan's footprint. Prints a Markdown table
and JSON.
"""

from __future__ import annotations

import json

from bench.arguments import CHECKPOINT_HELP, bench_parser
from bench.process import run_child
from edge.frontend.options import resolve_model_path

MiB = 2**20


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.memory", __doc__, model=CHECKPOINT_HELP,
                          methods="ar,ngram,early-exit:3,builtin", max_context=2048, max_new_tokens=128,
                          json={"help": "write the measurements here"})
    parser.add_argument("--naive", default="builtin",
                        help="the method the generation-memory table compares with (SpecMemo's naive allocation: "
                             "a full-precision draft model with a full-context cache and full-vocabulary buffers)")
    args = parser.parse_args(argv)
    model = resolve_model_path(args.model)
    rows = []
    for method in args.methods.split(","):
        spec, *options = method.split("+")
        request = {"model": str(model), "method": spec, "max_context": args.max_context,
                   "max_new_tokens": args.max_new_tokens}
        for option in options:
            if option.startswith("ctx"):
                request["draft_context"] = int(option[3:])
            elif option == "bf16":
                request["draft_weights"] = "bfloat16"
            else:
                parser.error(f"unknown method option +{option} in {method}; expected +ctxN or +bf16")
        rows.append(run_child("bench.memory_worker:measure", request, method, prog="python -m bench.memory"))
    print("| method | runtime MiB | plan MiB (weights + KV + speculation) | predicted peak MiB | measured peak MiB "
          "| measured / predicted | resident loaded, over runtime MiB | after answering MiB | after answering / plan "
          "| tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        plan = row["footprint"]
        loaded, answered = row["loaded_rss"] - row["runtime_rss"], row["resident_rss"] - row["runtime_rss"]
        print(f"| {row['method']} | {row['runtime_rss'] / MiB:.0f} | {plan['total'] / MiB:.1f} "
              f"({plan['target_weights'] / MiB:.1f} + {plan['target_kv'] / MiB:.1f} + {plan['speculation'] / MiB:.1f})"
              f" | {row['predicted'] / MiB:.0f} | {row['peak_rss'] / MiB:.0f} | {row['peak_rss'] / row['predicted']:.3f}"
              f" | {loaded / MiB:.0f} | {answered / MiB:.0f} | {answered / plan['total']:.3f}"
              f" | {row['tokens_per_s']:.0f} |")
    print()
    print(generation_table(rows, args.naive))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


def generation_table(rows: list[dict], naive: str) -> str:
    """Speculation's own memory (beyond the target's weights and KV) per method, against the naive method's."""
    base = next((row for row in rows if row["method"] == naive), None)
    plain = next((row for row in rows if row["method"] == "ar"), None)
    lines = ["| method | generation memory MiB (plan) | drafter allocated MiB | peak over ar MiB | tokens/s "
             f"| saved vs {naive} | tokens/s vs {naive} |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["method"] == "ar":
            continue
        speculation = row["footprint"]["speculation"]
        over = f"{(row['peak_rss'] - plain['peak_rss']) / MiB:.1f}" if plain else "-"
        memory = f"{1 - speculation / base['footprint']['speculation']:.0%}" if base else "-"
        speed = f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        lines.append(f"| {row['method']} | {speculation / MiB:.2f} | {row['allocated']['drafter'] / MiB:.2f} | {over} "
                     f"| {row['tokens_per_s']:.0f} | {memory} | {speed} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
