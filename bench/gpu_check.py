"""Decoding on a CUDA GPU: plain, QuantSpec and layer offload on one checkpoint, tokens/s and acceptance, each
greedy output compared with plain decoding's on the same device.

    python -m bench.gpu_check CHECKPOINT [--tokens 128] [--out FILE.json]

CHECKPOINT: a folder or GGUF file edge loads (for a memory-bound target without a download, the built-in model
widened to 1B: python -m bench.memory_bound OUT --params 1B, then OUT/target). Each configuration decodes the same
Spec-Bench prompts (one per category) after one untimed warm-up reply; the figures are medians over the prompts.
The offload rows give the planner a memory budget the weights do not fit, so it streams layers from host memory.
With --dtype float16 (the default) decode steps, verify passes and self-drafts run the graph-captured static step
(edge/model/static_step.py); the "plain, eager" row runs the same model without it.
Needs a CUDA GPU; elsewhere it says so and exits 2.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.arguments import bench_parser
from bench.prompts import CATEGORIES, PROMPTS
from edge import Engine

# (name, load options): each compared with the plain row of the same weights and KV cache; "eager" rows turn the
# graph-captured static step off (EDGE_STATIC_STEP=0: every layer's kernels launched from Python, as before it)
CONFIGURATIONS = (
    ("plain", {}),
    ("quantspec k=3", {"drafter": "quantspec", "draft_length": 3}),
    ("quantspec k=5", {"drafter": "quantspec", "draft_length": 5}),
    ("quantspec adaptive", {"drafter": "quantspec"}),
    ("quantspec:8 k=3", {"drafter": "quantspec:8", "draft_length": 3}),
    ("layer skip (skip:3,5,7,9) k=3", {"drafter": "skip:3,5,7,9", "draft_length": 3}),
    ("early exit (early-exit:6) k=3", {"drafter": "early-exit:6", "draft_length": 3}),
    ("plain, eager", {"eager": True}),
)


def one_prompt_per_category() -> list[list[dict]]:
    chosen = {}
    for prompt in PROMPTS:
        chosen.setdefault(prompt.category, prompt.messages)
    return [chosen[category] for category in CATEGORIES if category in chosen]


def decode(engine: Engine, messages: list[dict], tokens: int) -> tuple[list[int], float, object]:
    engine.reset()
    torch.cuda.synchronize()
    start = time.perf_counter()
    events = list(engine.chat(messages, max_new_tokens=tokens, ignore_eos=True, temperature=0.0))
    torch.cuda.synchronize()
    stats = events[-1].stats
    return [t for e in events for t in e.token_ids], time.perf_counter() - start, stats


def run(engine: Engine, prompts: list[list[dict]], tokens: int) -> dict:
    decode(engine, prompts[0], 16)  # untimed: Triton compiles, caches fill
    replies, speeds, whole, drafted, accepted, steps, draft_s, verify_s = [], [], [], 0, 0, 0, 0.0, 0.0
    for messages in prompts:
        ids, wall_s, stats = decode(engine, messages, tokens)
        replies.append(ids)
        speeds.append(stats.tokens_per_s)
        whole.append(stats.generated_tokens / wall_s)
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        steps, draft_s, verify_s = steps + stats.steps, draft_s + stats.draft_s, verify_s + stats.verify_s
    return {"replies": replies, "decode_tokens_per_s": round(statistics.median(speeds), 1),
            "whole_reply_tokens_per_s": round(statistics.median(whole), 1),
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "draft_ms_per_step": round(1e3 * draft_s / steps, 3),
            "verify_ms_per_step": round(1e3 * verify_s / steps, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.gpu_check", __doc__,
                          tokens={"default": 128, "help": "tokens per reply (default: 128)"},
                          dtype={"default": "float16", "help": "compute dtype (default: float16)"})
    parser.add_argument("checkpoint")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here (JSON)")
    parser.add_argument("--profile", action="store_true", help="also print where the time of a plain and a QuantSpec "
                        "reply goes (torch.profiler)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_check: needs a CUDA GPU; nothing was measured", file=sys.stderr)
        return 2
    prompts = one_prompt_per_category()
    common = {"device": "cuda", "dtype": args.dtype, "max_context": 1024, "kv_cache": "hierarchical"}
    rows, plain_replies = [], {}
    for name, options in CONFIGURATIONS:
        options = dict(options)
        eager = options.pop("eager", False)
        os.environ["EDGE_STATIC_STEP"] = "0" if eager else os.environ.get("EDGE_STATIC_STEP_BENCH", "")
        engine = Engine.load(args.checkpoint, **common, **options)
        result = run(engine, prompts, args.tokens)
        if "drafter" not in options and not eager:
            plain_replies[None] = result["replies"]
            plain_speed = result["decode_tokens_per_s"]
        result["equal_to_plain"] = result.pop("replies") == plain_replies[None]
        result["speedup_over_plain"] = round(result["decode_tokens_per_s"] / plain_speed, 2)
        rows.append({"configuration": name, "weight_bytes": engine.model.weight_bytes(), **result})
        if eager:
            rows[-1]["informational"] = True  # other arithmetic (the eager kernels): equal tokens not required
        print(json.dumps(rows[-1]), flush=True)
        del engine
        torch.cuda.empty_cache()
    os.environ["EDGE_STATIC_STEP"] = os.environ.get("EDGE_STATIC_STEP_BENCH", "")
    weight_bytes = rows[0]["weight_bytes"]
    for name, options in (("plain offloaded", {}), ("quantspec offloaded k=3",
                                                   {"drafter": "quantspec", "draft_length": 3})):
        budget = int(weight_bytes * 0.6)  # the layers do not fit: the planner streams some from host memory
        engine = Engine.load(args.checkpoint, **common, memory_budget=budget, **options)
        streamer = getattr(engine.model, "streamer", None)
        result = run(engine, prompts, args.tokens)
        context = {**common, "max_context": engine.max_context}  # the planner may have shortened the context
        del engine
        # all on the device, eager as the offloaded target is (offloaded layers run outside the static step)
        os.environ["EDGE_STATIC_STEP"] = "0"
        plain = run(Engine.load(args.checkpoint, **context), prompts, args.tokens)
        os.environ["EDGE_STATIC_STEP"] = os.environ.get("EDGE_STATIC_STEP_BENCH", "")
        result["equal_to_plain"] = result.pop("replies") == plain.pop("replies")
        result["eager_plain_at_that_context_tokens_per_s"] = plain["decode_tokens_per_s"]
        result["graph_plain_tokens_per_s"] = rows[0]["decode_tokens_per_s"]
        rows.append({"configuration": name, "memory_budget": budget, "max_context": context["max_context"],
                     "offloaded_layers": len(streamer.order) if streamer is not None else 0,
                     "peak_gpu_bytes": torch.cuda.max_memory_allocated(), **result})
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if args.profile:
        for name, options in CONFIGURATIONS[:2]:
            engine = Engine.load(args.checkpoint, **common, **options)
            decode(engine, prompts[0], 16)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as profile:
                decode(engine, prompts[0], 32)
            print(f"== {name}: 32 tokens")
            print(profile.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=50))
            print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=50))
    report = {"device": torch.cuda.get_device_name(), "checkpoint": str(args.checkpoint), "dtype": args.dtype,
              "tokens": args.tokens, "prompts": len(prompts), "rows": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    return 0 if all(row["equal_to_plain"] for row in rows if not row.get("informational")) else 1


if __name__ == "__main__":
    sys.exit(main())
