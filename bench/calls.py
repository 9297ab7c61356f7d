"""What one target call costs as the number of rows grows: the quantity that bounds speculative decoding.

    python -m bench.calls [MODEL] [--rows 1,2,3,5,8] [--context 64] [--drafter PATH] [--repeats 50]
                               [--weights float32|int8|int4] [--bandwidth]

A verify pass over k drafted tokens feeds k + 1 rows. If it costs c times a 1-row decode step, a step must emit
more than c tokens on average to gain anything, and a free drafter whose every token is accepted with probability a
gains at most (1 - a^(k+1)) / (1 - a) / c. The table gives, per row count, the median time of one call (model +
head, after `--context` tokens are in the cache), c, and that bound at a = 0.6, 0.8 and 0.9. `--drafter` also times
one step of a separate draft model (as a fraction of the target's step). `--weights float32` widens a 16-bit
checkpoint's weights to float32 copies first (what edge did before it kept 16-bit weights; the same results);
`--weights int8` or `int4` quantizes the layers' matrices and the head (edge/model/packed_weights.py; a slightly
different model).

Each call is timed alone (the cache is rolled back after it); medians over `--repeats` calls, interleaved by row
count so that drift in the machine's speed hits every row count alike. `--bandwidth` also probes the machine's read
bandwidth in every round (the kernel's probe: a 1 GiB buffer summed on the same threads) and says what share of it a
1-row call reaches: the weights one step reads (every matrix and the head; an embedding that is not the head gives
one row) over the call's time.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.arguments import CHECKPOINT_HELP, bench_parser
from edge.frontend.options import resolve_model_path

ACCEPTANCE = (0.6, 0.8, 0.9)
PROBE_FLOATS = 2**28  # the bandwidth probe's buffer: 1 GiB of float32, far larger than any CPU cache


def expected_tokens(acceptance: float, drafted: int) -> float:
    """Tokens one step emits on average: accepted drafts (each accepted with `acceptance`, stopping at the first
    rejection) plus the target's own token."""
    return sum(acceptance**i for i in range(drafted + 1))


def time_calls(model, cache, rows: list[int], context: int, repeats: int,
               probe=None) -> dict[int | str, float]:
    """Median seconds of one `model(tokens)` + head call over n new rows at position `context`, per n; with `probe`
    (a function returning GB/s), its median too, under "bandwidth", probed once per round between the calls."""
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, context), generator=generator)  # (1, context)
    with torch.inference_mode():
        model.logits(model(prompt, 0, cache))
        samples: dict[int | str, list[float]] = {n: [] for n in rows}
        if probe is not None:
            samples["bandwidth"] = []
        for repeat in range(repeats + 3):  # the first rounds warm the caches up
            if probe is not None and repeat >= 3:
                samples["bandwidth"].append(probe())
            for n in rows:
                feed = torch.randint(0, vocab, (1, n), generator=generator)  # (1, n)
                started = time.perf_counter()
                model.forward_logits(feed, context, cache)
                elapsed = time.perf_counter() - started
                cache.rollback(context)
                if repeat >= 3:
                    samples[n].append(elapsed)
    return {n: statistics.median(values) for n, values in samples.items()}


def step_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every weight held, less the embedding where it is not the head (a
    step looks up one row of it)."""
    held = model.weight_bytes()
    embedding = model.embed
    tied = model.lm_head is None and model.packed_head is None
    if tied or (model.packed_head is not None and getattr(embedding, "matrix", None) is model.packed_head):
        return held
    from edge.model.transformer import held_bytes

    return held - held_bytes([embedding])


def bandwidth_probe(model):
    """A function returning the read bandwidth (GB/s) on the model's kernel and threads, one pass over a 1 GiB
    buffer allocated once; None where the model runs without edge's kernel."""
    kernel = model.runner.matmul
    if kernel is None:
        return None
    buffer = torch.ones(PROBE_FLOATS, dtype=torch.float32)  # (PROBE_FLOATS,)
    return lambda: kernel.read_bandwidth(data=buffer, repeats=1)


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
    parser.add_argument("--bandwidth", action="store_true",
                        help="probe the read bandwidth in turns with the calls and give the 1-row call's share of it")
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
    probe = bandwidth_probe(model) if args.bandwidth else None
    if args.bandwidth and probe is None:
        parser.error("--bandwidth needs edge's CPU kernel (EDGE_ROWWISE_MATMUL=0 turns it off)")
    seconds = time_calls(model, cache, rows, args.context, args.repeats, probe)
    step = seconds[1]
    bounds = " | ".join(f"bound a={a}" for a in ACCEPTANCE)
    print(f"| rows | ms per call | cost c (x 1 row) | {bounds} |")
    print("|---:|---:|---:|" + "---:|" * len(ACCEPTANCE))
    for n in rows:
        cost = seconds[n] / step
        limits = " | ".join(f"{expected_tokens(a, n - 1) / cost:.2f}x" for a in ACCEPTANCE)
        print(f"| {n} | {seconds[n] * 1e3:.3f} | {cost:.2f} | {limits} |")
    if probe is not None:
        weights = step_weight_bytes(model)
        reached = weights / step / 1e9
        print(f"\nweights a step reads: {weights / 1e6:.1f} MB; one row: {reached:.1f} GB/s = "
              f"{reached / seconds['bandwidth']:.0%} of the read bandwidth probed in turns "
              f"({seconds['bandwidth']:.1f} GB/s, median)")
    if args.drafter:
        from edge.sources.builtin import builtin_drafter_path

        path = str(builtin_drafter_path()) if args.drafter == "builtin" else args.drafter
        draft_model, draft_cache = load(path, args.context + 2)
        draft_step = time_calls(draft_model, draft_cache, [1], args.context, args.repeats)[1]
        print(f"\ndraft model step: {draft_step * 1e3:.3f} ms = {draft_step / step:.2f} of a target step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
