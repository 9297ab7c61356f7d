"""How fast edge reads a prompt: one prompt of --tokens random token ids from an empty cache, the head on its last
row only (as llama-bench's pp test computes it), the median of --repeats timed runs after one warm-up.

    python -m bench.prefill [MODEL] [--tokens 512] [--repeats 3]

Compare with `llama-bench -m FILE -p 512 -n 0 -t 2` on the same file, taking turns.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.arguments import CHECKPOINT_HELP, bench_parser
from edge.frontend.options import resolve_model_path


def prefill_seconds(model, tokens: int, repeats: int) -> float:
    """Median seconds of one `tokens`-token prompt through the model, the head on its last row."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator)  # (1, T)
    samples = []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first run warms the caches up
            cache = model.new_cache(tokens)
            started = time.perf_counter()
            hidden = model(prompt, 0, cache)  # (1, T, D)
            model.logits(hidden[:, -1:])  # (1, 1, V)
            samples.append(time.perf_counter() - started)
    return statistics.median(samples[1:])


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.prefill", __doc__, model=CHECKPOINT_HELP, repeats=3,
                          tokens={"default": 512, "help": "prompt tokens (default 512, llama-bench's pp512)"})
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.repeats < 1:
        parser.error("--tokens and --repeats need positive numbers")
    from edge.engine import Engine

    model = Engine.load(resolve_model_path(args.model), max_context=args.tokens).model
    seconds = prefill_seconds(model, args.tokens, args.repeats)
    print(f"prefill of {args.tokens} tokens: {seconds * 1e3:.1f} ms, {args.tokens / seconds:.1f} tokens/s "
          f"(median of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
