"""One memory measurement in a fresh process: resident memory after imports (the runtime's own overhead), then the
plan's prediction against the peak resident memory of loading the engine and generating, and the resident memory
once loaded and once it has generated.

    run_child("bench.memory_worker:measure", {"model": PATH, "method": "builtin", "max_context": 2048,
              "max_new_tokens": 128, "draft_context": None, "draft_weights": None}, ...)     (bench/memory.py)

Peak RSS is the process's ru_maxrss (kernel-measured high-water mark)."""

from __future__ import annotations

import resource
import time

import psutil

ROOMY_BUDGET = 1 << 40  # plan with room to spare: the plan is what is measured, not what fits


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


def measure(request: dict) -> dict:
    """The child's work (bench.process): the figures of one method (see the module's docstring)."""
    import torch  # noqa: F401 - measured as part of the runtime's overhead

    from edge import Engine
    from bench.prompts import PROMPTS
    from edge.kernels.cpu_kernel import CpuKernel

    CpuKernel.load()
    warm_up_libraries()
    import onnxruntime  # noqa: F401 - a runtime dependency of edge: counted in the runtime for every method
    runtime = psutil.Process().memory_info().rss  # interpreter, torch and its math libraries, edge, the kernel
    method, max_context, max_new_tokens = request["method"], request["max_context"], request["max_new_tokens"]
    draft_context, draft_weights = request.get("draft_context"), request.get("draft_weights")
    drafter = None if method == "ar" else method
    engine = Engine.load(request["model"], max_context=max_context, drafter=drafter,
                         memory_budget=request.get("budget", ROOMY_BUDGET), draft_context=draft_context,
                         draft_weights=draft_weights)
    loaded = psutil.Process().memory_info().rss  # the loaded model, before any prompt
    started = time.perf_counter()
    tokens = 0
    for prompt in PROMPTS[:5]:
        for event in engine.chat(prompt.messages, max_new_tokens=max_new_tokens, temperature=0.0):
            tokens += len(event.token_ids)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    resident = psutil.Process().memory_info().rss  # after answering: the model and what generating kept
    plan = engine.plan
    notes = [f"draft context {draft_context}"] * bool(draft_context) + \
        [f"{draft_weights} drafter weights"] * bool(draft_weights)
    label = method + (f" ({', '.join(notes)})" if notes else "")
    return {"method": label, "runtime_rss": runtime, "predicted": runtime + plan.footprint.total, "peak_rss": peak,
            "loaded_rss": loaded, "resident_rss": resident, "footprint": plan.footprint.to_dict(),
            "allocated": engine.memory_footprint(), "tokens_per_s": tokens / seconds, "max_context": plan.max_context}
