"""What one target call costs as the number of rows grows: the quantity that bounds speculative decoding.

    python -m bench.calls [MODEL] [--rows 1,2,3,5,8] [--context 64] [--drafter PATH] [--repeats 50]
                               [--weights float32|int8|int4]

A verify pass over k drafted tokens feeds k + 1 rows. If it costs c times a 1-row decode step, a step must emit
more than c tokens on average to gain anything, and a free drafter whose every token is accepted with probability a
gains at most (1 - a^(k+1)) / (1 - a) / c. The table gives, per row count, the median time of one call (model +
head, after `--context` tokens are in the cache), c, and that bound at a = 0.6, 0.8 and 0.9. `--drafter` also times
one step of a separate draft model (as a fraction of the target's step). `--weights float32` widens a 16-bit
checkpoint's weights to float32 copies first (what edge did before it kept 16-bit weights; the same results);
`--weights int8` or `int4` quantizes the layers' matrices and the head (edge/model/packed_weights.py; a slightly
different model).

Each call is timed alone (the cache is rolled back after it); medians over `--repeats` calls, interleaved by row
count so that drift in the machine's speed hits every row count alike.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.arguments import CHECKPOINT_HELP, bench_parser
from edge.frontend.options import resolve_model_path

ACCEPTANCE = (0.6, 0.8, 0.9)


def expected_tokens(acceptance: float, drafted: int) -> float:
    """Tokens one step emits on average: accepted drafts (each accepted with `acceptance`, stopping at the first
    rejection) plus the target's own token."""
    return sum(acceptance**i for i in range(drafted + 1))


def time_calls(model, cache, rows: list[int], context: int, repeats: int) -> dict[int, float]:
    """Median seconds of one `model(tokens)` + head call over n new rows at position `context`, per n."""
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, context), generator=generator)  # (1, context)
    with torch.inference_mode():
        model.logits(model(prompt, 0, cache))
        samples: dict[int, list[float]] = {n: [] for n in rows}
        for repeat in range(repeats + 3):  # the first rounds warm the caches up
            for n in rows:
                feed = torch.randint(0, vocab, (1, n), generator=generator)  # (1, n)
                started = time.perf_counter()
                model.forward_logits(feed, context, cache)
                elapsed = time.perf_counter() - started
                cache.rollback(context)
                if repeat >= 3:
                    samples[n].append(elapsed)
    return {n: statistics.median(values) for n, values in samples.items()}


def load(path: str, max_context: int):
    from edge.engine import Engine

    engine = Engine.load(path, max_context=max_context)
    return engine.model, engine.model.new_cache(max_context)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.calls", __doc__, model=CHECKPOINT_HELP, repeats=50,
        context={"default": 64, "help": "tokens already in the cache (default 64)"},
        drafter={"help": "a draft model folder to time one step of (`builtin`: the built-in one)"},
        weights={"choices": ["checkpoint", "float32", "int8", "int4"], "default": "checkpoint",
                 "help": "keep the weights as loaded (default: a 16-bit checkpoint stays 16-bit), widen them, or "
                         "quantize the layers and head to int8 or int4"})
    parser.add_argument("--rows", default="1,2,3,5,8", help="row counts to time (1 is always included)")
    args = parser.parse_args(argv)
    rows = sorted({1, *(int(n) for n in args.rows.split(","))})
    if rows[0] < 1 or args.context < 1 or args.repeats < 1:
        parser.error("--rows, --context and --repeats need positive numbers")
    model, cache = load(resolve_model_path(args.model), args.context + max(rows) + 1)
    if args.weights == "float32":
        model.store_weights(torch.float32)
    elif args.weights in ("int8", "int4"):
        from edge.model.packed_weights import quantize_weights

        quantize_weights(model, args.weights)
    seconds = time_calls(model, cache, rows, args.context, args.repeats)
    step = seconds[1]
    bounds = " | ".join(f"bound a={a}" for a in ACCEPTANCE)
    print(f"| rows | ms per call | cost c (x 1 row) | {bounds} |")
    print("|---:|---:|---:|" + "---:|" * len(ACCEPTANCE))
    for n in rows:
        cost = seconds[n] / step
        limits = " | ".join(f"{expected_tokens(a, n - 1) / cost:.2f}x" for a in ACCEPTANCE)
        print(f"| {n} | {seconds[n] * 1e3:.3f} | {cost:.2f} | {limits} |")
    if args.drafter:
        from edge.sources.builtin import builtin_drafter_path

        path = str(builtin_drafter_path()) if args.drafter == "builtin" else args.drafter
        draft_model, draft_cache = load(path, args.context + 2)
        draft_step = time_calls(draft_model, draft_cache, [1], args.context, args.repeats)[1]
        print(f"\ndraft model step: {draft_step * 1e3:.3f} ms = {draft_step / step:.2f} of a target step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
