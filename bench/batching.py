"""Continuous batching's throughput: N sequences decoding in one fused pass a step (edge/decoding/batch.py) against
one alone, on a real model file, greedy, every sequence's prompt already prefilled (decode steps only are timed).

    python -m bench.batching                                  the default model, 1, 2 and 4 sequences
    python -m bench.batching MODEL.gguf --sequences 1,4,8 --tokens 64 --repeats 3 --json out.json

The counts run in turns (1, 2, 4, 1, 2, 4, ...), and each figure is the median over the repeats of the aggregate
decode tokens/s (every sequence's tokens over the wall time of the steps); the last column is that over the
single sequence's. Sequences answer different prompts (each a different length), and each reply is checked against
the same prompt's reply alone: batching changes no token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from edge import Engine
from edge.decoding.batch import SequenceBatch
from edge.decoding.sampling import SamplingParams

PROMPTS = ["Write a Python function that reverses a linked list.", "What is the capital of France?",
           "Explain what a hash map is in two sentences.", "List three uses of the json module.",
           "How do I read a CSV file with pandas?", "What does the yield keyword do?",
           "Translate 'good morning' into Spanish.", "Give an example of a list comprehension."]


def decode_rate(engine: Engine, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    """Aggregate decode tokens/s of the prompts in one batch, and each reply."""
    context = max(len(prompt) for prompt in prompts) + tokens + 1
    batch = SequenceBatch(engine.model, regions=len(prompts), context=context)
    sequences = [batch.add(prompt, SamplingParams(temperature=0), tokens) for prompt in prompts]
    while any(len(s.generated) == 0 for s in sequences):  # every prompt's prefill and first token: not timed
        batch.step()
    started, made = time.perf_counter(), 0
    while batch.running:
        made += len(batch.step())
    return made / (time.perf_counter() - started), [sequence.generated for sequence in sequences]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="a model file or folder (default: the default model)")
    parser.add_argument("--sequences", default="1,2,4", help="comma-separated sequence counts")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each sequence decodes")
    parser.add_argument("--repeats", type=int, default=3, help="turns over the counts; medians are reported")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    counts = [int(count) for count in args.sequences.split(",")]
    engine = Engine.load(args.model) if args.model else Engine.load()
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": text}], add_generation_prompt=True)
               for text in PROMPTS]
    alone = {i: decode_rate(engine, [prompts[i % len(prompts)]], args.tokens)[1][0] for i in range(max(counts))}
    for count in counts:  # warm up: the thread governor settles each pass size's thread count (edge/kernels/threads.py)
        decode_rate(engine, [prompts[i % len(prompts)] for i in range(count)], 16)
    rates: dict[int, list[float]] = {count: [] for count in counts}
    for repeat in range(args.repeats):
        for count in counts:
            rate, replies = decode_rate(engine, [prompts[i % len(prompts)] for i in range(count)], args.tokens)
            if replies != [alone[i] for i in range(count)]:
                print(f"bench.batching: {count} sequences changed a reply", file=sys.stderr)
                return 1
            rates[count].append(rate)
            print(f"repeat {repeat + 1}/{args.repeats}: {count} sequences {rate:.1f} tokens/s", file=sys.stderr)
    single = statistics.median(rates[counts[0]])
    print("| sequences | aggregate decode tokens/s (median) | over the first count |")
    print("|---:|---:|---:|")
    results = []
    for count in counts:
        median = statistics.median(rates[count])
        results.append({"sequences": count, "tokens_per_s": median, "runs": rates[count]})
        print(f"| {count} | {median:.1f} | {median / single:.2f}x |")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"model": args.model or "default", "tokens": args.tokens, "results": results}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
