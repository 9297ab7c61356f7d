"""Run the whole prompt set with one decoding method in its own process: `measure`, which edge-bench's suite runs
through bench.process (bench/suite.py: run_method, run_interleaved).

    {"model": PATH, "method": METHOD, "draft_length": "adaptive" or K, "max_new_tokens": N, ...}  -> one result
    {"model": PATH, "interleave": [["ar", "adaptive"], ["ngram", "2"]], "passes": P, ...}        -> {"runs": [...]}

"prompts" (indices into bench.prompts.PROMPTS; default: all of them) picks the prompts run. Each finished prompt is
reported to the parent (bench.process.report_progress): edge-bench's progress line and ETA.

Interleaved, one process runs every listed method on each prompt in turn (edge's methods on one loaded target, plain
decoding first; a peer on its own model), for P passes: one result per method, like the single-method form, each
prompt's time the median over the passes. Methods timed seconds apart share the machine's slow spells, which on a
shared VM move whole minutes' speeds by a third. Peak memory is then the one process's, for all methods together.

METHOD: `ar` (edge, plain decoding), any drafter spec edge takes (`ngram`, `early-exit:4`, `adaptive`,
`draft:PATH`, `builtin`, `feature`, `hybrid:feature`), or a peer: `hf` (transformers generate), `hf-assisted:PATH`
(assisted generation with that draft model), `hf-lookup` (transformers prompt lookup), `llama.cpp:GGUF` (llama.cpp on
that file) and `llama.cpp-lookup:GGUF` (with llama-cpp-python's prompt lookup decoding). Greedy; generation stops at end-of-sequence or N tokens.
Time per prompt is the wall time of the whole call (prefill included), the same measure for every method
(edge-bench --repeats runs the worker once per pass and takes medians across passes).
"""

from __future__ import annotations

import time
from typing import Callable

from bench import llama_cpp, llama_server
from bench.checkpoints import source_checkpoint
from bench.process import peak_rss_mib, report_progress
from bench.prompts import PROMPTS
from bench.suite import SUITE_CONTEXT, is_peer

Runner = Callable[[list[int], int], tuple[list[int], dict]]


def edge_runner(model: str, method: str, draft_length: str, dtype: str, kv_cache: str | None = None,
                weights: str | None = None, draft_weights: str | None = None) -> tuple[Runner, list[list[int]], int]:
    """run(prompt_ids, new_tokens), the prompt set's ids, and the bytes of the target's weights (what a step reads)."""
    from edge.engine import Engine
    from edge.load_spec import kv_cache_for

    engine = Engine.load(model, dtype=dtype, max_context=SUITE_CONTEXT,
                         kv_cache=kv_cache_for(None if method == "ar" else method, kv_cache), weights=weights)
    if method != "ar":
        engine.use_drafter(method, draft_length, dtype=dtype, draft_weights=draft_weights)
    prompts = [engine.tokenizer.encode_chat(p.messages) for p in PROMPTS]

    return (lambda prompt_ids, new_tokens: generate_once(engine, prompt_ids, new_tokens)), prompts, \
        engine.model.weight_bytes()


def generate_once(engine, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], dict]:
    """One greedy generation from a fresh cache: its token ids, and the counters the suite reports (steps, drafts,
    acceptance, time split)."""
    engine.reset()
    events = list(engine.generate(prompt_ids, max_new_tokens=new_tokens, task=None, temperature=0.0))
    stats = events[-1].stats
    return [token for event in events for token in event.token_ids], {
        "steps": stats.steps, "drafted": stats.drafted, "accepted": stats.accepted, "draft_s": stats.draft_s,
        "verify_s": stats.verify_s, "decode_tokens": stats.decode_tokens, "decode_seconds": stats.decode_s}


def interleaved_runs(model: str, methods: list[tuple[str, str]], passes: int, max_new_tokens: int, dtype: str,
                     kv_cache: str | None = None, weights: str | None = None,
                     draft_weights: str | None = None, chosen: list[int] | None = None) -> list[dict]:
    """Every (method, draft length) on each prompt in turn (the `chosen` indices of PROMPTS, default all), `passes`
    times over them, in this process:
    edge's methods share a loaded target per KV cache format (each drafter built once; QuantSpec's has its own
    hierarchical cache), a peer loads its own model."""
    import statistics

    from edge.engine import Engine
    from edge.load_spec import kv_cache_for

    engines: dict[str | None, Engine] = {}

    def engine_for(method: str) -> Engine:
        format = kv_cache_for(None if method == "ar" else method, kv_cache)
        if format not in engines:
            engines[format] = Engine.load(model, dtype=dtype, max_context=SUITE_CONTEXT, kv_cache=format,
                                          weights=weights)
        return engines[format]

    prompts = [engine_for("ar").tokenizer.encode_chat(p.messages) for p in PROMPTS]

    def edge_run(engine, drafter, length) -> Runner:
        def run(prompt_ids: list[int], new_tokens: int) -> tuple[list[int], dict]:
            engine.use_drafter(drafter, length)
            return generate_once(engine, prompt_ids, new_tokens)
        return run

    runners: list[Runner] = []
    for method, length in methods:
        if is_peer(method):
            runners.append(peer_runner(model, method, dtype)[0])
        elif method == "ar":
            runners.append(edge_run(engine_for(method), None, "adaptive"))
        else:
            engine = engine_for(method)
            engine.use_drafter(method, length, dtype=dtype, draft_weights=draft_weights)
            runners.append(edge_run(engine, engine.drafter, engine.draft_length))

    def timed(run: Runner, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], dict, float]:
        prepare(run)
        t0 = time.perf_counter()
        out, stats = run(prompt_ids, new_tokens)
        return out, stats, time.perf_counter() - t0

    for run in runners:
        timed(run, prompts[0], 16)  # warm-up
    chosen = list(range(len(PROMPTS))) if chosen is None else chosen
    records: list[list[list]] = [[[] for _ in chosen] for _ in methods]  # [method][prompt] -> runs
    for number_of_pass in range(passes):
        for index, prompt_index in enumerate(chosen):
            for number, run in enumerate(runners):
                records[number][index].append(timed(run, prompts[prompt_index], max_new_tokens))
            report_progress(number_of_pass * len(chosen) + index + 1, passes * len(chosen))
    peak = peak_rss_mib()
    results = []
    for (method, length), by_prompt in zip(methods, records):
        rows = []
        for prompt_index, runs in zip(chosen, by_prompt):
            prompt, ids = PROMPTS[prompt_index], prompts[prompt_index]
            out, stats, _ = runs[0]
            if any(run_ids != out for run_ids, _, _ in runs):
                raise SystemExit(f"{method} gave different outputs in different passes")
            times = [seconds for _, _, seconds in runs]
            if "decode_seconds" in stats:
                stats = {**stats, "decode_seconds": statistics.median(s["decode_seconds"] for _, s, _ in runs)}
            rows.append({"category": prompt.category, "prompt_tokens": len(ids), "new_tokens": len(out),
                         "seconds": statistics.median(times), "pass_seconds": times, "token_ids": out, **stats})
        weight_bytes = {} if is_peer(method) else {"target_weight_bytes": engine.model.weight_bytes()}
        results.append({"method": method, "draft_length": length, "prompts": rows, "peak_rss_mib": peak,
                        **weight_bytes})
    return results


def prepare(run: Runner) -> None:
    """A runner's untimed reset before each timed request, where it has one (llama-server's n-gram modes)."""
    reset = getattr(run, "before_each", None)
    if reset is not None:
        reset()


def peer_runner(model: str, method: str, dtype: str) -> tuple[Runner, list[list[int]]]:
    """transformers (hf...), llama.cpp (llama.cpp...) or llama.cpp's server (llama-server...) for a peer method."""
    if method.startswith("llama-server"):
        return llama_server_runner(model, method)
    return llama_cpp_suite_runner(model, method) if method.startswith("llama.cpp") else hf_runner(model, method, dtype)


def hf_runner(model: str, method: str, dtype: str) -> tuple[Runner, list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM

    from edge.text.tokenizer import Tokenizer

    model = source_checkpoint(model)
    target = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    extra: dict = {}
    if method.startswith("hf-assisted:"):
        extra["assistant_model"] = AutoModelForCausalLM.from_pretrained(
            method.partition(":")[2], dtype=getattr(torch, dtype)).eval()
    elif method == "hf-lookup":
        extra["prompt_lookup_num_tokens"] = 10
    tokenizer = Tokenizer.from_dir(model)
    prompts = [tokenizer.encode_chat(p.messages) for p in PROMPTS]
    pad = target.generation_config.pad_token_id
    pad = pad if pad is not None else 0

    def run(prompt_ids: list[int], new_tokens: int) -> tuple[list[int], dict]:
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                  do_sample=False, pad_token_id=pad, **extra)
        return out[0, len(prompt_ids):].tolist(), {}

    return run, prompts


LLAMA_CPP_LOOKUP_TOKENS = 2  # llama-cpp-python's advice for prompt lookup on a CPU alone (10 on a GPU)


def llama_cpp_suite_runner(model: str, method: str) -> tuple[Runner, list[list[int]]]:
    """llama.cpp on the GGUF file named in the method, fed the same prompt ids as edge, stopping where edge stops."""
    import torch

    from edge.model.config import ModelConfig
    from edge.text.tokenizer import Tokenizer

    kind, _, gguf = method.partition(":")
    model = source_checkpoint(model)
    tokenizer = Tokenizer.from_dir(model)
    stop = frozenset(tokenizer.eos_token_ids) | frozenset(ModelConfig.from_dir(model).eos_token_ids)
    prompts = [tokenizer.encode_chat(p.messages) for p in PROMPTS]
    llm = llama_cpp.load(gguf, context=2048, threads=torch.get_num_threads(),
                         lookup=LLAMA_CPP_LOOKUP_TOKENS if kind == "llama.cpp-lookup" else None)
    return (lambda prompt_ids, new_tokens: (llama_cpp.greedy(llm, prompt_ids, new_tokens, stop), {})), prompts


def llama_server_runner(model: str, method: str) -> tuple[Runner, list[list[int]]]:
    """llama.cpp's server in one mode (bench/llama_server.py), fed the same prompt ids as edge."""
    import torch

    from edge.text.tokenizer import Tokenizer

    mode, target, draft = llama_server.parse_method(method)
    tokenizer = Tokenizer.from_dir(source_checkpoint(model))
    prompts = [tokenizer.encode_chat(p.messages) for p in PROMPTS]
    server = llama_server.LlamaServer(llama_server.find_binary(), target, mode=mode, draft=draft,
                                      threads=torch.get_num_threads(), context=SUITE_CONTEXT)

    def run(prompt_ids: list[int], new_tokens: int) -> tuple[list[int], dict]:
        return server.greedy(prompt_ids, new_tokens)

    if mode in llama_server.NGRAM_MODES:  # no n-grams remembered from earlier requests (restarted untimed)
        run.before_each = server.restart
    return run, prompts


def measure(request: dict) -> dict:
    """The child's work (bench.process): one method over the prompt set ("method", "draft_length"), or with
    "interleave" ([[method, draft length], ...]) every method prompt by prompt for "passes" passes, as {"runs": [...]};
    both on "model" with "max_new_tokens", "dtype", "kv_cache", "weights" and "draft_weights"."""
    model, new_tokens, dtype = request["model"], request["max_new_tokens"], request["dtype"]
    chosen = request.get("prompts")
    if request.get("interleave"):
        methods = [(method, length) for method, length in request["interleave"]]
        return {"runs": interleaved_runs(model, methods, request["passes"], new_tokens, dtype, request["kv_cache"],
                                         request["weights"], request["draft_weights"], chosen)}
    method, draft_length = request["method"], request["draft_length"]
    weight_bytes = {}
    if is_peer(method):
        run, prompts = peer_runner(model, method, dtype)
    else:
        run, prompts, target_bytes = edge_runner(model, method, draft_length, dtype, request["kv_cache"],
                                                 request["weights"], request["draft_weights"])
        weight_bytes = {"target_weight_bytes": target_bytes}
    run(prompts[0], 16)  # warm-up
    chosen = list(range(len(PROMPTS))) if chosen is None else chosen
    results = []
    for done, prompt_index in enumerate(chosen, 1):
        prompt, ids = PROMPTS[prompt_index], prompts[prompt_index]
        prepare(run)
        t0 = time.perf_counter()
        out, stats = run(ids, new_tokens)
        seconds = time.perf_counter() - t0
        results.append({"category": prompt.category, "prompt_tokens": len(ids), "new_tokens": len(out),
                        "seconds": seconds, "token_ids": out, **stats})
        report_progress(done, len(chosen))
    return {"method": method, "draft_length": draft_length, "prompts": results, "peak_rss_mib": peak_rss_mib(),
            **weight_bytes}
