"""edge-bench's speculative suite: every method over the prompt set, each in its own process, compared with edge's
autoregressive decoding on the same prompts (speedup, mean accepted tokens, acceptance, memory, identical output)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable

from bench import llama_server
from bench.process import run_child
from bench.prompts import CATEGORIES

SUITE_CONTEXT = 2048  # the context every edge method of the suite loads with (and --plan plans for)

SPEC_BENCH_CATEGORIES = [c for c in CATEGORIES if c != "code"]  # Spec-Bench's six; "code" is reported on its own
Progress = Callable[[int, int], None]  # (prompts done, prompts in all), as a worker reports them


def run_method(model: Path, method: str, draft_length: str, max_new_tokens: int, dtype: str,
               kv_cache: str | None = None, weights: str | None = None, draft_weights: str | None = None, *,
               prompts: list[int] | None = None, on_progress: Progress | None = None) -> dict:
    """One method over the prompt set (`prompts`: indices into it; default all) in a worker process of its own
    (bench.suite_worker.measure); `on_progress(done, total)` hears of each finished prompt."""
    request = {"model": str(model), "method": method, "draft_length": draft_length, "max_new_tokens": max_new_tokens,
               "dtype": dtype, "kv_cache": kv_cache, "weights": weights, "draft_weights": draft_weights,
               "prompts": prompts}
    return run_child("bench.suite_worker:measure", request, label(method, draft_length), on_progress=on_progress)


def run_interleaved(model: Path, runs: list[tuple[str, str]], passes: int, max_new_tokens: int, dtype: str,
                    kv_cache: str | None = None, weights: str | None = None,
                    draft_weights: str | None = None, *, prompts: list[int] | None = None,
                    on_progress: Progress | None = None) -> list[dict]:
    """Every method (method, draft length) in one worker process, prompt by prompt (bench.suite_worker.measure);
    `on_progress(done, total)` hears of each prompt finished by every method, over all the passes."""
    request = {"model": str(model), "interleave": [list(run) for run in runs], "passes": passes,
               "max_new_tokens": max_new_tokens, "dtype": dtype, "kv_cache": kv_cache, "weights": weights,
               "draft_weights": draft_weights, "prompts": prompts}
    return run_child("bench.suite_worker:measure", request, "interleaved run", on_progress=on_progress)["runs"]


def median_of_passes(results: list[dict]) -> dict:
    """One method's runs from several passes -> one result: per prompt the median time (the outputs are checked
    equal: greedy decoding is deterministic)."""
    first = results[0]
    prompts = []
    for index, prompt in enumerate(first["prompts"]):
        runs = [result["prompts"][index] for result in results]
        if any(run["token_ids"] != prompt["token_ids"] for run in runs):
            raise SystemExit(f"edge-bench: {label(first['method'], first['draft_length'])} gave different outputs "
                             f"in different passes on prompt {index}")
        times = [run["seconds"] for run in runs]
        decode = {"decode_seconds": statistics.median(run["decode_seconds"] for run in runs)} \
            if "decode_seconds" in prompt else {}
        prompts.append({**prompt, "seconds": statistics.median(times), "pass_seconds": times, **decode})
    return {**first, "prompts": prompts, "peak_rss_mib": max(result["peak_rss_mib"] for result in results)}


def faster_baseline(first: dict, last: dict) -> dict:
    """Plain decoding timed at the start and at the end of a suite: per prompt the faster of the two, so a slow
    spell during one of them does not inflate every method's speedup."""
    prompts = [dict(a, seconds=min(a["seconds"], b["seconds"])) for a, b in zip(first["prompts"], last["prompts"])]
    for prompt, a, b in zip(prompts, first["prompts"], last["prompts"]):
        if "decode_seconds" in a and "decode_seconds" in b:
            prompt["decode_seconds"] = min(a["decode_seconds"], b["decode_seconds"])
    return {**first, "prompts": prompts}


def is_peer(method: str) -> bool:
    """transformers (hf, hf-lookup, hf-assisted:PATH) or llama.cpp (llama.cpp:GGUF, llama.cpp-lookup:GGUF,
    llama-server:MODE:GGUF[@DRAFT]), by run or by table label."""
    return method.startswith(("hf", "llama.cpp", "llama-server"))


def label(method: str, draft_length: str) -> str:
    """How a method appears in the tables: drafters carry their draft length; AR and the peers do not."""
    if method == "ar-end":
        return "ar (again, at the end)"
    if method.startswith("llama-server"):
        return llama_server.label(method)
    if method.startswith("llama.cpp"):
        kind, _, gguf = method.partition(":")
        precision = Path(gguf).name.removesuffix(".gguf").rsplit("-", 1)[-1]  # llama_cpp.converted: NAME-KEY-TYPE
        return f"llama.cpp {precision}" + (" + prompt lookup" if kind == "llama.cpp-lookup" else "")
    return method if method == "ar" or is_peer(method) else f"{method} (k={draft_length})"


def summarise(result: dict, baseline: dict) -> dict:
    prompts, base = result["prompts"], baseline["prompts"]
    per_prompt = [b["seconds"] / r["seconds"] * (r["new_tokens"] / max(b["new_tokens"], 1))
                  for r, b in zip(prompts, base)]  # per-token speedup against edge AR on the same prompt
    by_category = {c: statistics.mean(s for s, p in zip(per_prompt, prompts) if p["category"] == c)
                   for c in CATEGORIES if any(p["category"] == c for p in prompts)}
    steps = sum(p.get("steps", 0) for p in prompts)
    drafted = sum(p.get("drafted", 0) for p in prompts)
    decode = decode_speedups(prompts, base)
    return {
        "method": label(result["method"], result["draft_length"]),
        "tokens_per_s": sum(p["new_tokens"] for p in prompts) / sum(p["seconds"] for p in prompts),
        "speedup_six": statistics.mean(by_category[c] for c in SPEC_BENCH_CATEGORIES if c in by_category),
        "speedup_by_category": by_category,
        "decode_speedup_six": decode and statistics.mean(decode[c] for c in SPEC_BENCH_CATEGORIES if c in decode),
        "decode_speedup_by_category": decode,
        "mean_accepted_tokens": sum(p["new_tokens"] for p in prompts) / steps if steps else None,
        "acceptance_rate": sum(p.get("accepted", 0) for p in prompts) / drafted if drafted else None,
        "peak_rss_mib": result["peak_rss_mib"],
        "identical_to_ar": all(r["token_ids"] == b["token_ids"] for r, b in zip(prompts, base)),
    }


def decode_speedups(prompts: list[dict], base: list[dict]) -> dict[str, float]:
    """Per category, the mean per-prompt speedup of the decode steps alone (time from the first token to the last;
    the prefill, the same work for every method, left out); empty where a run has no decode timings (the peers)."""
    if not all("decode_seconds" in p and p.get("decode_tokens") for p in (*prompts, *base)):
        return {}
    per_prompt = [(b["decode_seconds"] / b["decode_tokens"]) / (r["decode_seconds"] / r["decode_tokens"])
                  for r, b in zip(prompts, base)]
    return {c: statistics.mean(s for s, p in zip(per_prompt, prompts) if p["category"] == c)
            for c in CATEGORIES if any(p["category"] == c for p in prompts)}


def markdown(rows: list[dict]) -> str:
    header = ["method", "tokens/s", "speedup (6 categories)", "code", *SPEC_BENCH_CATEGORIES,
              "decode steps only: 6 categories", "code", "mean accepted", "acceptance", "peak RSS MiB", "identical"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        by, decode = row["speedup_by_category"], row.get("decode_speedup_by_category") or {}
        cells = [row["method"], f"{row['tokens_per_s']:.1f}", f"**{row['speedup_six']:.2f}x**",
                 f"{by.get('code', 0):.2f}x", *[f"{by.get(c, 0):.2f}x" for c in SPEC_BENCH_CATEGORIES],
                 f"{row['decode_speedup_six']:.2f}x" if decode else "-",
                 f"{decode['code']:.2f}x" if "code" in decode else "-",
                 "-" if row["mean_accepted_tokens"] is None else f"{row['mean_accepted_tokens']:.2f}",
                 "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.0%}",
                 f"{row['peak_rss_mib']:.0f}", "yes" if row["identical_to_ar"] else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> bool:
    """A bar chart of speedup per category for each method; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    categories = ["code", *SPEC_BENCH_CATEGORIES]
    figure, axis = plt.subplots(figsize=(10, 4), dpi=110)
    width = 0.8 / max(len(rows), 1)
    for index, row in enumerate(rows):
        values = [row["speedup_by_category"].get(c, 0) for c in categories]
        axis.bar([i + index * width for i in range(len(categories))], values, width, label=row["method"])
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(categories))], categories)
    axis.set_ylabel("speedup over edge autoregressive")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True
