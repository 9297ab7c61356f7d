"""How far edge's greedy output agrees with llama.cpp's on the same GGUF file, beside how far two llama.cpp builds
agree with each other.

    python -m bench.gguf_agreement FILE.gguf [FILE.gguf ...] --runtime edge --runtime edge:avx2 \\
        --runtime llama.cpp:native=DIR --runtime llama.cpp:avx2=DIR [--max-new-tokens 64]

A runtime is `edge` (this CPU's path), `edge:PATH` (EDGE_CPU_KERNEL=PATH) or `llama.cpp:NAME=DIR`: llama-cpp-python
installed in DIR (pip install --target DIR; each build in its own folder, put first on PYTHONPATH). Every runtime
runs in its own process, on the same prompt token ids (edge-bench's chat prompts, bench/prompts.py, through the
file's chat template), greedy until an end-of-sequence token or --max-new-tokens. Two runtimes that round
differently agree until a near-tie flips; the table gives, for each pair, how many replies are identical and the
mean number of leading tokens they share.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from itertools import combinations
from pathlib import Path

from bench.arguments import bench_parser
from bench.process import run_child


def _replies_edge(model: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    from edge.engine import Engine

    engine = Engine.load(model, max_context=4096)
    replies = []
    for ids in prompts:
        engine.reset()
        replies.append([t for event in engine.generate(ids, max_new_tokens=max_new_tokens, temperature=0.0) for t in event.token_ids])
    return replies


def _replies_llama_cpp(model: str, prompts: list[list[int]], max_new_tokens: int, stop: list[int]) -> list[list[int]]:
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=4096, n_threads=os.cpu_count(), n_threads_batch=os.cpu_count(), verbose=False)
    replies = []
    for ids in prompts:
        llm.reset()
        reply: list[int] = []
        for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            reply.append(token)
            if token in stop or len(reply) == max_new_tokens:
                break
        replies.append(reply)
    return replies


def runtime_replies(task: dict) -> list[list[int]]:
    """The child's work (bench.process): one runtime's replies ("runtime": edge or llama.cpp) to the task's prompts."""
    if task["runtime"] == "edge":
        return _replies_edge(task["model"], task["prompts"], task["max_new_tokens"])
    return _replies_llama_cpp(task["model"], task["prompts"], task["max_new_tokens"], task["stop"])


def run_runtime(spec: str, task: dict) -> list[list[int]]:
    """One runtime's replies, computed in a process of its own."""
    env = {}
    kind, _, rest = spec.partition(":")
    if kind == "edge":
        if rest:
            env["EDGE_CPU_KERNEL"] = rest
    elif kind == "llama.cpp":
        _, _, folder = rest.partition("=")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
    else:
        raise SystemExit(f"gguf_agreement: runtime {spec!r}: use edge, edge:PATH or llama.cpp:NAME=DIR")
    return run_child("bench.gguf_agreement:runtime_replies", {**task, "runtime": kind}, spec, prog="gguf_agreement",
                     env=env)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m bench.gguf_agreement", __doc__, max_new_tokens=64)
    parser.add_argument("files", nargs="*", help=".gguf files")
    parser.add_argument("--runtime", action="append", default=[], help="edge, edge:PATH or llama.cpp:NAME=DIR")
    args = parser.parse_args(argv)
    from bench.prompts import PROMPTS
    from edge.frontend.options import resolve_model_path
    from edge.model.kv_cache import common_prefix
    from edge.text.tokenizer import Tokenizer

    print("| file | runtimes | identical replies | shared leading tokens (mean) | reply tokens (mean) |")
    print("|---|---|---:|---:|---:|")
    for file in args.files:
        folder = resolve_model_path(file)
        tokenizer = Tokenizer.from_dir(folder)
        config = json.loads((folder / "config.json").read_text())
        stop = sorted(set(tokenizer.eos_token_ids) | set(config.get("eos_token_id") or []))
        prompts = [tokenizer.encode_chat(prompt.messages) for prompt in PROMPTS]
        task = {"model": str(Path(file).resolve()), "prompts": prompts, "max_new_tokens": args.max_new_tokens,
                "stop": stop}
        replies = {spec: run_runtime(spec, task) for spec in args.runtime}
        for first, second in combinations(args.runtime, 2):
            pairs = list(zip(replies[first], replies[second]))
            same = sum(a == b for a, b in pairs)
            shared = statistics.mean(common_prefix(a, b) for a, b in pairs)
            length = statistics.mean(max(len(a), len(b)) for a, b in pairs)
            names = " / ".join(spec.partition("=")[0] for spec in (first, second))
            print(f"| {Path(file).name} | {names} | {same}/{len(pairs)} | {shared:.1f} | {length:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
