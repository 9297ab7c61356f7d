"""Where a decoding step's time goes: drafting, the verify pass, and the rest, per method.

    python -m bench.steps [MODEL] [--methods ar,ngram:2,builtin:2] [--max-new-tokens 128] [--weights int8|int4]
                               [--kv-cache float32|int8|int8-int4|hierarchical]

A method is `ar` or DRAFTER:K (K a fixed draft length or `adaptive`). Each runs the bench prompt set twice in this
process and reports the second pass (the first warms up): tokens/s, milliseconds per step, the engine's own draft
and verify times per step, and tokens per step.
"""

from __future__ import annotations

import time

from bench.arguments import CHECKPOINT_HELP, bench_parser
from bench.suite_worker import edge_runner
from edge.frontend.options import resolve_model_path


def measure(model: str, method: str, max_new_tokens: int, weights: str | None = None,
            kv_cache: str | None = None) -> dict:
    spec, _, length = method.rpartition(":") if method != "ar" else ("ar", "", "")
    run, prompts, _ = edge_runner(model, spec, length or "adaptive", "float32", kv_cache=kv_cache, weights=weights)
    for _ in range(2):  # the second pass is reported
        seconds = draft_s = verify_s = 0.0
        tokens = steps = 0
        for ids in prompts:
            started = time.perf_counter()
            emitted, stats = run(ids, max_new_tokens)
            seconds += time.perf_counter() - started
            tokens, steps = tokens + len(emitted), steps + stats["steps"]
            draft_s, verify_s = draft_s + stats["draft_s"], verify_s + stats["verify_s"]
    return {"method": method, "tokens_per_s": tokens / seconds, "ms_per_step": seconds * 1e3 / steps,
            "draft_ms": draft_s * 1e3 / steps, "verify_ms": verify_s * 1e3 / steps, "tokens_per_step": tokens / steps}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.steps", __doc__, model=CHECKPOINT_HELP, methods="ar,ngram:2,builtin:2", max_new_tokens=128,
        weights={"choices": ["int8", "int4"], "help": "quantize the target at load (edge/model/packed_weights.py)"},
        kv_cache={"choices": ["float32", "int8", "int8-int4", "hierarchical"],
                  "help": "KV cache format for every method (hierarchical: what the quantspec drafter reads); "
                          "default: float32, hierarchical for quantspec"})
    args = parser.parse_args(argv)
    model = resolve_model_path(args.model)
    print("| method | tokens/s | ms per step | draft ms | verify ms | tokens per step |")
    print("|---|---:|---:|---:|---:|---:|")
    for method in args.methods.split(","):
        row = measure(model, method, args.max_new_tokens, args.weights, args.kv_cache)
        print(f"| {row['method']} | {row['tokens_per_s']:.1f} | {row['ms_per_step']:.3f} | {row['draft_ms']:.3f} | "
              f"{row['verify_ms']:.3f} | {row['tokens_per_step']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
