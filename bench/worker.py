"""One benchmark backend in its own process, so its peak memory is its own: `measure`, run by edge-bench --ar
through bench.process (run_child("bench.worker:measure", request, ...)).

Decode speed uses the same method for every backend: the median wall time of generating N tokens minus the
median time of generating 1 token (prefill + first token), over N - 1 tokens. With several runs (edge-bench
--interleave) the backends load into this one process and take turns, repeat by repeat, so that drift in the
machine's speed (a shared server's neighbours) hits them alike; their ratios are then the steadiest figure. Greedy,
end-of-sequence ignored, so every backend produces exactly N tokens and the outputs can be compared token for token.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from bench.checkpoints import source_checkpoint
from bench.process import peak_rss_mib


def timed(run: Callable[[int], list[int]], new_tokens: int, repeats: int) -> tuple[float, list[int]]:
    times, ids = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ids = run(new_tokens)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), ids


def edge_runner(model: str, dtype: str, prompt_ids: list[int], max_new_tokens: int,
                weights: str | None = None) -> Callable[[int], list[int]]:
    from edge.engine import Engine

    # the KV cache is preallocated: size it for this run, as the memory planner will
    engine = Engine.load(model, dtype=dtype, max_context=len(prompt_ids) + max_new_tokens + 1, weights=weights)

    def run(new_tokens: int) -> list[int]:
        engine.reset()  # no prefix reuse between repeats: every run prefills the whole prompt
        ids: list[int] = []
        for event in engine.generate(prompt_ids, max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0):
            ids.extend(event.token_ids)
        return ids

    return run


def transformers_runner(model: str, dtype: str, prompt_ids: list[int], max_new_tokens: int,
                        weights: str | None = None) -> Callable[[int], list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(source_checkpoint(model), dtype=getattr(torch, dtype)).eval()
    hf.generation_config.eos_token_id = None  # ignore end-of-sequence, like edge's ignore_eos
    pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
    input_ids = torch.tensor([prompt_ids])

    def run(new_tokens: int) -> list[int]:
        with torch.inference_mode():
            out = hf.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        return out[0, len(prompt_ids):].tolist()

    return run


def llama_runner(model: str, dtype: str, prompt_ids: list[int], max_new_tokens: int,
                 weights: str | None = None) -> Callable[[int], list[int]]:
    import torch

    from bench.llama_cpp import llama_cpp_runner  # imports edge, the whole runtime: not before the baseline memory

    return llama_cpp_runner(model, prompt_ids, max_new_tokens, threads=torch.get_num_threads())


def backend_label(backend: str, model: str, dtype: str, weights: str | None) -> str:
    from edge.sources.gguf_checkpoint import checkpoint_from_gguf, gguf_index

    if backend == "llama.cpp":
        index = gguf_index(checkpoint_from_gguf(model))  # the file's own type (q4_k_m, ...), from its header
        return f"llama.cpp {index['file_type']}"
    if backend != "edge":
        return backend
    from edge.backends.bundle import is_bundle, read_bundle

    if is_bundle(model):
        return f"edge onnx {read_bundle(model, verify=False).manifest['quantization']['weights']}"
    if weights:
        return f"edge torch {weights}"
    index = gguf_index(model)
    if index is not None:
        return f"edge {index['file_type']}"
    from edge.planning import kept_weight_dtype

    return f"edge torch {kept_weight_dtype(model, dtype, 'cpu')}"


RUNNERS = {"edge": edge_runner, "transformers": transformers_runner, "llama.cpp": llama_runner}


def measure(request: dict) -> list[dict]:
    """The child's work (bench.process): `request` holds "runs" ([{"backend", "model", "weights"}, ...]: one, or
    several timed in turns), "prompt_ids", "dtype", "max_new_tokens" and "repeats"; one result per run."""
    import torch

    specs, prompt_ids, new_tokens = request["runs"], request["prompt_ids"], request["max_new_tokens"]
    baseline = peak_rss_mib()
    runners, loads = [], []
    for spec in specs:
        t0 = time.perf_counter()
        runners.append(RUNNERS[spec["backend"]](spec["model"], request["dtype"], prompt_ids, new_tokens,
                                                spec.get("weights")))
        loads.append(time.perf_counter() - t0)
        runners[-1](4)  # warm-up
    firsts: list[list[float]] = [[] for _ in specs]
    totals: list[list[float]] = [[] for _ in specs]
    outputs: list[list[int]] = [[] for _ in specs]
    for _ in range(request["repeats"]):  # in turns: a slow spell of the machine hits every run alike
        for index, run in enumerate(runners):
            first_s, _ = timed(run, 1, 1)
            total_s, outputs[index] = timed(run, new_tokens, 1)
            firsts[index].append(first_s)
            totals[index].append(total_s)
    shared = {"torch_threads": torch.get_num_threads(), "prompt_tokens": len(prompt_ids), "baseline_rss_mib": baseline}
    return [result(spec, request["dtype"], load_s, first, total, ids, shared)
            for spec, load_s, first, total, ids in zip(specs, loads, firsts, totals, outputs)]


def result(spec: dict, dtype: str, load_s: float, first: list[float], total: list[float], ids: list[int],
           shared: dict) -> dict:
    """One run's figures from its per-repeat times."""
    first_s, total_s = statistics.median(first), statistics.median(total)
    return {
        "backend": backend_label(spec["backend"], spec["model"], dtype, spec.get("weights")),
        "torch_threads": shared["torch_threads"],
        "load_s": load_s,
        "prompt_tokens": shared["prompt_tokens"],
        "new_tokens": len(ids),
        "first_token_s": first_s,
        "total_s": total_s,
        "decode_tokens_per_s": (len(ids) - 1) / max(total_s - first_s, 1e-9),
        "decode_tokens_per_s_by_repeat": [(len(ids) - 1) / max(t - f, 1e-9) for f, t in zip(first, total)],
        "prefill_tokens_per_s": shared["prompt_tokens"] / first_s,
        "peak_rss_mib": peak_rss_mib(),  # several runs in turns: every run's together
        "baseline_rss_mib": shared["baseline_rss_mib"],
        "token_ids": ids,
    }
