"""Run the whole prompt set with one decoding method in its own process; print one JSON object.

    python -m edge.bench.suite_worker --model PATH --method METHOD [--draft-length adaptive|K] [--max-new-tokens N]

METHOD: `ar` (edge, plain decoding), any drafter spec edge takes (`ngram`, `early-exit:4`, `adaptive`,
`draft:PATH`, `builtin`, `feature`, `hybrid:feature`), or a peer: `hf` (transformers generate), `hf-assisted:PATH`
(assisted generation with that draft model), `hf-lookup` (transformers prompt lookup). Greedy; generation stops at end-of-sequence or N tokens.
Time per prompt is the wall time of the whole call (prefill included), the same measure for every method
(edge-bench --repeats runs the worker once per pass and takes medians across passes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

from edge.bench.prompts import PROMPTS
from edge.bench.worker import peak_rss_mib

Runner = Callable[[list[int], int], tuple[list[int], dict]]


def edge_runner(model: str, method: str, draft_length: str, dtype: str,
                kv_cache: str = "float32") -> tuple[Runner, list[list[int]]]:
    from edge.engine import Engine

    engine = Engine.load(model, dtype=dtype, max_context=2048, kv_cache=kv_cache)
    if method != "ar":
        engine.use_drafter(method, draft_length, dtype=dtype)
    prompts = [engine.tokenizer.encode_chat(p.messages) for p in PROMPTS]

    def run(prompt_ids: list[int], new_tokens: int) -> tuple[list[int], dict]:
        engine.reset()
        events = list(engine.generate(prompt_ids, max_new_tokens=new_tokens, task=None))
        stats = events[-1].stats
        ids = [token for event in events for token in event.token_ids]
        return ids, {"steps": stats.steps, "drafted": stats.drafted, "accepted": stats.accepted,
                     "draft_s": stats.draft_s, "verify_s": stats.verify_s}

    return run, prompts


def hf_runner(model: str, method: str, dtype: str) -> tuple[Runner, list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM

    from edge.tokenizer import Tokenizer

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


def source_checkpoint(model: str) -> str:
    """A peer runs a bundle's source checkpoint (it cannot read edge's graphs): the same weights, unquantized."""
    from edge.bundle import is_bundle, read_bundle

    return read_bundle(model, verify=False).manifest["source"]["path"] if is_bundle(model) else model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge.bench.suite_worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--draft-length", default="adaptive")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache", default="float32")
    args = parser.parse_args(argv)

    if args.method.startswith("hf"):
        run, prompts = hf_runner(args.model, args.method, args.dtype)
    else:
        run, prompts = edge_runner(args.model, args.method, args.draft_length, args.dtype, args.kv_cache)
    run(prompts[0], 16)  # warm-up
    results = []
    for prompt, ids in zip(PROMPTS, prompts):
        t0 = time.perf_counter()
        out, stats = run(ids, args.max_new_tokens)
        seconds = time.perf_counter() - t0
        results.append({"category": prompt.category, "prompt_tokens": len(ids), "new_tokens": len(out),
                        "seconds": seconds, "token_ids": out, **stats})
    json.dump({"method": args.method, "draft_length": args.draft_length, "prompts": results,
               "peak_rss_mib": peak_rss_mib()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
