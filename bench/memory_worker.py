"""One memory measurement in a fresh process: resident memory after imports (the runtime's own overhead), then the
plan's prediction against the peak resident memory of loading the engine and generating, and the resident memory
once loaded and once it has generated.

    python -m bench.memory_worker --model PATH --method builtin --max-context 2048 --max-new-tokens 128

Prints one JSON object. Peak RSS is the process's ru_maxrss (kernel-measured high-water mark)."""

from __future__ import annotations

import argparse
import json
import resource
import time

import psutil


def warm_up_libraries() -> None:
    """Run each kind of torch kernel once on tiny inputs: math libraries allocate their pools on first use, and that
    is runtime overhead, not the model's."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(64, 64)
    F.linear(x, x)
    q = torch.randn(1, 2, 64, 16)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.softmax(x, -1).argmax()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", default="ar")
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--budget", default=str(1 << 40))
    parser.add_argument("--draft-context", type=int, help="a draft model's own cache length (default: the context)")
    parser.add_argument("--draft-weights", help="bfloat16: store a draft model's weights narrower")
    args = parser.parse_args()

    import torch  # noqa: F401 - measured as part of the runtime's overhead

    from edge import Engine
    from bench.prompts import PROMPTS
    from edge.kernels.cpu_kernel import CpuKernel

    CpuKernel.load()
    warm_up_libraries()
    import onnxruntime  # noqa: F401 - a runtime dependency of edge: counted in the runtime for every method
    runtime = psutil.Process().memory_info().rss  # interpreter, torch and its math libraries, edge, the kernel
    drafter = None if args.method == "ar" else args.method
    engine = Engine.load(args.model, max_context=args.max_context, drafter=drafter, memory_budget=int(args.budget),
                         draft_context=args.draft_context, draft_weights=args.draft_weights)
    loaded = psutil.Process().memory_info().rss  # the loaded model, before any prompt
    started = time.perf_counter()
    tokens = 0
    for prompt in PROMPTS[:5]:
        for event in engine.chat(prompt.messages, max_new_tokens=args.max_new_tokens):
            tokens += len(event.token_ids)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    resident = psutil.Process().memory_info().rss  # after answering: the model and what generating kept
    plan = engine.plan
    notes = [f"draft context {args.draft_context}"] * bool(args.draft_context) + \
        [f"{args.draft_weights} drafter weights"] * bool(args.draft_weights)
    label = args.method + (f" ({', '.join(notes)})" if notes else "")
    print(json.dumps({"method": label, "runtime_rss": runtime, "predicted": runtime + plan.footprint.total,
                      "peak_rss": peak, "loaded_rss": loaded, "resident_rss": resident,
                      "footprint": plan.footprint.to_dict(), "allocated": engine.memory_footprint(),
                      "tokens_per_s": tokens / seconds, "max_context": plan.max_context}))


if __name__ == "__main__":
    main()
