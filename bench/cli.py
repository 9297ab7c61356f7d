"""edge-bench: decoding speed and memory of edge's methods (and of transformers, where installed), side by side.

    edge-bench [MODEL] [--methods ar,ngram,early-exit,adaptive,builtin] [--draft-lengths adaptive,4] [--peers]
    edge-bench [MODEL] --quick                  a short run: plain decoding and the model's default drafter, one
                                                prompt per category, 64 tokens, one pass (about a minute or less)
    edge-bench [MODEL] --ar [--peers [NAMES]]   plain decoding throughput on one prompt, edge vs transformers and
                                                llama.cpp (at the precision matching edge's weights)
    edge-bench --scaling R1,R2,R3 --out DIR     suite reports side by side, by the target's weight bytes

The default mode runs the prompt set (Spec-Bench's six categories plus code) through edge's autoregressive
decoding and each speculative method, checks that every greedy output is identical to autoregressive decoding,
and writes a JSON report, a Markdown table and a plot. Each method runs in its own process, one after the other
in the same run, so peak memory is measured separately and speeds are comparable; with --interleave every
method (the peers too) runs in one process instead, prompt by prompt, which keeps speed ratios steady on a noisy machine.
Progress goes to stderr as each prompt finishes: the pass, the method, the prompts done and the time left (ETA).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

from bench import llama_cpp, llama_server, scaling, suite
from bench.arguments import bench_parser
from bench.checkpoints import source_checkpoint
from bench.process import busy_processes, run_child
from bench.progress import RunProgress
from bench.prompts import PROMPTS, quick_prompts
from edge.frontend.options import default_drafter, print_plan, resolve_model_path
from edge.sources.builtin import builtin_model_path, shipped_datastores, shipped_for
from edge.sources.default_model import DEFAULT_MODEL_HELP
from edge.sources.gguf_checkpoint import gguf_index
from edge.decoding.registry import usage as drafter_usage
from edge.errors import EdgeError
from edge.model.kv_cache import common_prefix
from edge.load_spec import DRAFT_WEIGHTS, DTYPES, LoadSpec
from edge.model.packed_weights import FORMATS as WEIGHT_QUANTIZATIONS
from edge.model.quantized_kv_cache import KV_CACHE_CHOICES
from edge.text.tokenizer import Tokenizer
PEERS = ("transformers", "llama.cpp", "llama-server")

SUITE_METHODS = "ar,ngram,early-exit,adaptive"  # the suite's methods on any model; the defaults add what ships for it
QUICK = {"max_new_tokens": 64, "repeats": 1}  # --quick's defaults, where the flags leave them out
FULL = {"max_new_tokens": 128, "repeats": 3}

DEFAULT_PROMPT = (
    "Write a short Python function that reads a text file and returns the ten most common words with their "
    "counts, then explain how it works."
)


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(
        "edge-bench", __doc__,
        model="checkpoint folder, edge-export bundle, .gguf file or Hub id (org/name; from the Hugging Face cache, "
              "else downloaded); " + DEFAULT_MODEL_HELP + ". With a bundle, the suite runs on ONNX Runtime and peers "
              "run its source checkpoint",
        methods={"default": None,
                 "help": f"suite: comma-separated methods: ar and drafter specs ({drafter_usage()}; draft:PATH may "
                         f"be a checkpoint or a bundle, bundle is a bundle's own drafter); default: {SUITE_METHODS}, "
                         "and builtin on the built-in model, retrieval where a datastore ships for the model; "
                         "--quick: ar and the drafter edge-chat --temperature 0 uses on the model (else ngram)"},
        max_new_tokens={"default": None, "help": f"tokens per reply (default: {FULL['max_new_tokens']}; --quick: "
                                                 f"{QUICK['max_new_tokens']})"},
        repeats={"default": None, "help": "timed repeats (--ar: per backend; suite: passes over every method, each "
                                          "method in its own process each time, or passes over the prompts with "
                                          "--interleave); medians are reported (default: "
                                          f"{FULL['repeats']}; --quick: {QUICK['repeats']})"},
        dtype={"default": "float32", "choices": DTYPES},
        weights={"choices": WEIGHT_QUANTIZATIONS,
                 "help": "quantize edge's target (layers and head) to int8 or int4 at load "
                         "(edge/model/packed_weights.py): in the suite for every edge method, the plain-decoding "
                         "baseline included (transformers runs the checkpoint as stored); with --ar for edge, and "
                         "llama.cpp runs q8_0 or q4_0"},
        kv_cache={"choices": KV_CACHE_CHOICES,
                  "help": "suite: KV cache format for every edge method, the plain-decoding baseline included "
                          "(hierarchical: QuantSpec's int4+int4, which the quantspec drafter reads); default: "
                          "float32, and hierarchical for quantspec, which then runs on a target of its own"},
        json={"type": Path, "help": "--ar: write the results as JSON here"})
    parser.add_argument("--ar", action="store_true", help="plain decoding throughput on one prompt (not the suite)")
    parser.add_argument("--quick", action="store_true",
                        help=f"suite: a short run, about a minute on 2 cores on the default model: one prompt of "
                             f"each category ({len(quick_prompts())} of {len(PROMPTS)}), "
                             f"{QUICK['max_new_tokens']} tokens, {QUICK['repeats']} pass, interleaved (one process, "
                             "one load), plain decoding against the model's default drafter; flags given as well "
                             "override these")
    parser.add_argument("--one-per-category", action="store_true",
                        help=f"suite: only the first prompt of each category ({len(quick_prompts())} of "
                             f"{len(PROMPTS)}, as --quick runs), with the other sizes as given")
    parser.add_argument("--background-load", type=int, default=0, metavar="N",
                        help="run N busy processes (one spinning core each) beside every runtime while it is measured, "
                             "as a laptop's other work does (default: 0, a quiet machine)")
    parser.add_argument("--peers", nargs="?", const="all", default=None, metavar="NAMES",
                        help="also run other runtimes: transformers (generate(), and in the suite its prompt "
                             "lookup and its assisted generation with each draft:PATH among --methods, else the "
                             "built-in drafter) and llama.cpp when llama-cpp-python is installed (pip install "
                             "'edge[peers]'; in the suite also with its prompt lookup decoding), on the checkpoint "
                             "converted to GGUF at the precision matching edge's (f32, f16, q8_0, q4_0); for a .gguf "
                             "file (or a Hub id naming one) llama.cpp runs that very file; in the suite also "
                             "llama-server, llama.cpp's own server (--llama-server), plain, in its n-gram modes "
                             "(ngram-simple, ngram-map-k, ngram-mod) and with each draft:FILE.gguf among --methods "
                             "as its draft model (draft-simple). NAMES (comma-separated: transformers, llama.cpp, "
                             "llama-server) picks some; default: all installed")
    parser.add_argument("--llama-server", metavar="PATH",
                        help="suite: the llama-server executable, built with cmake from llama.cpp's source "
                             "(default: $EDGE_LLAMA_SERVER, else llama-server on PATH)")
    parser.add_argument("--llama-cpp-source", metavar="DIR",
                        help="--ar: a llama.cpp source tree whose convert_hf_to_gguf.py converts the checkpoint "
                             "(default: $EDGE_LLAMA_CPP_SOURCE, else the installed llama-cpp-python's sdist, "
                             "fetched once into the cache)")
    parser.add_argument("--draft-lengths", default="adaptive",
                        help="suite: comma-separated draft lengths to try for every drafter: adaptive, adaptive:P "
                             "(with a confidence stop at probability P) and/or numbers")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="suite: folder for suite.json, suite.md and suite.png (default: bench-results)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="--ar: prompt text (encoded with the model's tokenizer)")
    parser.add_argument("--interleave", action="store_true",
                        help="suite: run every method, the peers included, in one process, one prompt at a time "
                             "(plain decoding, then each method, on the same prompt), so methods are timed seconds apart and share "
                             "the machine's slow spells; --ar: every backend in one process, taking turns repeat by "
                             "repeat (ratios: the median of per-repeat ratios). Peak memory is then for all "
                             "together")
    parser.add_argument("--draft-weights", default=None, choices=DRAFT_WEIGHTS,
                        help="suite: how a separate draft model (draft:PATH, builtin) stores its weights; int8 "
                             "quantizes its layers for edge's CPU kernel (default: as its checkpoint)")
    parser.add_argument("--bundles", default="", metavar="B1,B2",
                        help="--ar: also run these edge-export bundles of the model (ONNX Runtime), side by side")
    parser.add_argument("--plan", action="store_true",
                        help="print the memory plan for the first speculative method in --methods (JSON) and exit "
                             "without loading weights or benchmarking")
    parser.add_argument("--scaling", metavar="R1,R2",
                        help="no run: put suite reports side by side (each an --out folder of a suite run, e.g. on "
                             "the 150M, 500M and 1B targets of python -m bench.memory_bound), ordered by the "
                             "bytes of weights the target reads per step; writes scaling.md and scaling.png in --out")
    parser.add_argument("--memory-budget", metavar="SIZE",
                        help="--plan: the budget to plan for, e.g. 512MiB (default: the free memory)")
    return parser


def print_bench_plan(args: argparse.Namespace) -> int:
    """--plan: the plan for the first speculative method of --methods, with the suite's load options."""
    lengths = [length for length in args.draft_lengths.split(",") if length]
    try:
        model = resolve_model_path(args.model)
        methods = [method for method in (args.methods or suite_methods(args, model)).split(",")
                   if method and method != "ar"]
        print_plan(LoadSpec.from_options(model, memory_budget=args.memory_budget,
                                         dtype=args.dtype, weights=args.weights, kv_cache=args.kv_cache,
                                         max_context=suite.SUITE_CONTEXT, drafter=methods[0] if methods else None,
                                         draft_length=lengths[0] if lengths else "adaptive",
                                         draft_weights=args.draft_weights))
    except EdgeError as error:
        print(f"edge-bench: error: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = fill_defaults(build_parser().parse_args(argv))
    if args.background_load < 0:
        print(f"edge-bench: error: --background-load must be 0 or more, got {args.background_load}", file=sys.stderr)
        return 2
    if args.background_load:
        print(f"edge-bench: {args.background_load} busy process(es) beside the runtimes", file=sys.stderr)
    with busy_processes(args.background_load):
        return run(args, argv)


def fill_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The run's sizes where the flags leave them out: --quick's, else the full run's (methods: `suite_methods`)."""
    sizes = QUICK if args.quick and not args.ar else FULL
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick and not args.ar:
        args.interleave = True
    return args


def suite_methods(args: argparse.Namespace, model: Path) -> str:
    """--methods where none is given: plain decoding and the drafters that fit `model` (see --methods' help)."""
    if args.quick:
        drafter = default_drafter(argparse.Namespace(drafter=None, temperature=0, model=args.model))
        return f"ar,{drafter or 'ngram'}"
    extra = []
    if builtin_model_path() is not None and model.resolve() == builtin_model_path().resolve():
        extra.append("builtin")
    elif shipped_for(Tokenizer.from_dir(model), shipped_datastores()) is not None:
        extra.append("retrieval")
    return ",".join([SUITE_METHODS, *extra])


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.plan:
        return print_bench_plan(args)
    if args.scaling:
        try:
            text, plotted = scaling.write([r for r in args.scaling.split(",") if r], args.out)
        except EdgeError as error:
            print(f"edge-bench: error: {error}", file=sys.stderr)
            return 2
        print(text)
        print(f"wrote {args.out / 'scaling.md'}" + (", scaling.png" if plotted else ""), file=sys.stderr)
        return 0
    if not args.ar:
        return run_suite(args, argv)
    try:
        model = resolve_model_path(args.model)
        prompt_ids = Tokenizer.from_dir(model).encode(args.prompt)
    except EdgeError as error:
        print(f"edge-bench: error: {error}", file=sys.stderr)
        return 2
    try:
        runs = [("edge", model)] + [("edge", Path(b)) for b in args.bundles.split(",") if b] + peer_runs(args, model)
    except EdgeError as error:
        print(f"edge-bench: error: {error}", file=sys.stderr)
        return 2
    if args.interleave:
        print(f"edge-bench: {', '.join(backend for backend, _ in runs)} in one process, taking turns "
              f"({args.repeats} repeats) ...", file=sys.stderr)
        results = run_interleaved_workers(runs, args, prompt_ids)
    else:
        results = []
        for backend, path in runs:
            print(f"edge-bench: running {backend} on {path} ...", file=sys.stderr)
            results.append(run_worker(backend, path, args, prompt_ids))
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_description(),
        "model": str(model),
        "dtype": args.dtype,
        "command": "edge-bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "interleaved": args.interleave,  # then every run shares one process, so one peak RSS for all
        "background_load": args.background_load,
        "results": results,
        "greedy_identical": len({tuple(r["token_ids"]) for r in results}) == 1,
        "identical_to_first": [r["token_ids"] == results[0]["token_ids"] for r in results],
        "agreeing_prefix": [common_prefix(r["token_ids"], results[0]["token_ids"]) for r in results],
    }
    print(markdown_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def run_suite(args: argparse.Namespace, argv: list[str] | None) -> int:
    try:
        model = resolve_model_path(args.model)
    except EdgeError as error:
        print(f"edge-bench: error: {error}", file=sys.stderr)
        return 2
    try:
        methods = [m.strip() for m in (args.methods or suite_methods(args, model)).split(",") if m.strip()]
    except EdgeError as error:
        print(f"edge-bench: error: {error}", file=sys.stderr)
        return 2
    lengths = [d.strip() for d in args.draft_lengths.split(",") if d.strip()]
    if "ar" not in methods:
        methods.insert(0, "ar")
    edge_runs = [(m, "adaptive") if m == "ar" else (m, d) for m in methods for d in (["adaptive"] if m == "ar"
                                                                                       else lengths)]
    try:
        peers = suite_peer_runs(args, model, methods)
    except EdgeError as error:
        print(f"edge-bench: error: {error}", file=sys.stderr)
        return 2
    prompts = quick_prompts() if args.quick or args.one_per_category else list(range(len(PROMPTS)))
    print(f"edge-bench: {', '.join(suite.label(m, d) for m, d in edge_runs + peers)} on {len(prompts)} prompts, "
          f"{args.max_new_tokens} tokens each, {args.repeats} pass(es)", file=sys.stderr)
    if args.interleave:
        progress = RunProgress(args.repeats * len(prompts))
        results = suite.run_interleaved(model, edge_runs + peers, args.repeats, args.max_new_tokens, args.dtype,
                                        args.kv_cache, args.weights, args.draft_weights, prompts=prompts,
                                        on_progress=interleaved_progress(progress, args.repeats, len(prompts),
                                                                         len(edge_runs + peers)))
        runs = []
    else:  # plain decoding again at the end: the baseline is the faster of the two
        results, runs = [], edge_runs + peers + [("ar-end", "adaptive")]
        progress = RunProgress(args.repeats * len(runs) * len(prompts))
    passes: list[list[dict]] = []
    for number in range(args.repeats):  # whole passes over the methods: a slow spell of the machine hits one pass
        passes.append([])
        for method, length in runs:
            report = progress.step(f"pass {number + 1}/{args.repeats}: {suite.label(method, length)}")
            result = suite.run_method(model, "ar" if method == "ar-end" else method, length,
                                      args.max_new_tokens, args.dtype, args.kv_cache,
                                      None if suite.is_peer(method) else args.weights, args.draft_weights,
                                      prompts=prompts, on_progress=report)
            passes[-1].append({**result, "method": method})
    progress.close()
    results += [suite.median_of_passes(runs_of_method) for runs_of_method in zip(*passes)]
    baseline = results[0] if args.interleave else suite.faster_baseline(results[0], results[-1])
    rows = [suite.summarise(result, baseline) for result in results]
    table = suite.markdown(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine_description(),
              "model": str(model), "dtype": args.dtype, "weights": args.weights or "as stored",
              "max_new_tokens": args.max_new_tokens,
              "target_weight_bytes": next((r["target_weight_bytes"] for r in results if "target_weight_bytes" in r),
                                          None),
              "command": "edge-bench " + " ".join(sys.argv[1:] if argv is None else argv), "summary": rows,
              "runs": results}
    (args.out / "suite.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "suite.md").write_text(table + "\n")
    plotted = suite.plot(rows, args.out / "suite.png")
    print(table)
    print(f"\nwrote {args.out / 'suite.json'}, suite.md" + (", suite.png" if plotted else ""), file=sys.stderr)
    return 0 if all(row["identical_to_ar"] for row in rows if not suite.is_peer(row["method"])) else 1


def interleaved_progress(progress: RunProgress, passes: int, prompts: int, methods: int):
    """An interleaved worker's reports (prompts done over all its passes) as per-pass steps of `progress`."""
    def report(done: int, total: int) -> None:
        number = min((done - 1) // prompts, passes - 1) if done else 0
        label = f"pass {number + 1}/{passes}: all {methods} methods, prompt by prompt"
        if progress.label != label:
            progress.step(label)
        progress.update(done - number * prompts, prompts)
    progress.step(f"pass 1/{passes}: loading, then all {methods} methods, prompt by prompt")
    return report


def suite_peer_runs(args: argparse.Namespace, model: Path, methods: list[str]) -> list[tuple[str, str]]:
    """The suite's peers: transformers' generate(), prompt lookup and assisted generation with each draft model among
    the methods (the built-in drafter when none is), and llama.cpp plain and with prompt lookup on the GGUF file at the
    precision matching edge's weights."""
    from edge.sources.builtin import builtin_drafter_path

    runs = []
    for peer, where in peer_runs(args, Path(source_checkpoint(str(model)))):
        if peer == "transformers":
            drafts = [m.removeprefix("draft:") for m in methods if m.startswith("draft:")]
            drafts = drafts or ([str(builtin_drafter_path())] if builtin_drafter_path() is not None else [])
            runs += [("hf", "adaptive"), ("hf-lookup", "adaptive")]
            runs += [(f"hf-assisted:{source_checkpoint(draft)}", "adaptive") for draft in drafts]
        elif peer == "llama-server":
            drafts = [Path(m.removeprefix("draft:")) for m in methods if m.startswith("draft:")]
            gguf_drafts = [d for d in drafts if d.suffix == ".gguf"]
            if len(gguf_drafts) < len(drafts):
                print("edge-bench: llama-server's draft-model mode takes draft:FILE.gguf methods only; the others "
                      "are left out of it", file=sys.stderr)
            modes = [(llama_server.PLAIN, None), *((mode, None) for mode in llama_server.NGRAM_MODES),
                     *((llama_server.DRAFT_MODEL, draft) for draft in gguf_drafts)]
            runs += [(llama_server.method_name(mode, where, draft), "adaptive") for mode, draft in modes]
        else:
            runs += [(f"llama.cpp:{where}", "adaptive"), (f"llama.cpp-lookup:{where}", "adaptive")]
    return runs


def peer_runs(args: argparse.Namespace, model: Path) -> list[tuple[str, Path]]:
    """The --ar peers to run: transformers on the checkpoint, llama.cpp on its GGUF at the matching precision; for a
    .gguf file (or a Hub id naming one), llama.cpp on that very file."""
    if args.peers is None:
        return []
    wanted = set(PEERS) if args.peers == "all" else set(args.peers.split(","))
    unknown = wanted - set(PEERS)
    if unknown:
        raise EdgeError(f"--peers {args.peers}: unknown peer {sorted(unknown)[0]!r}; use {', '.join(PEERS)}")
    server = server_peer(args, model) if "llama-server" in wanted else []
    wanted.discard("llama-server")
    return _library_peer_runs(args, model, wanted) + server


def server_peer(args: argparse.Namespace, model: Path) -> list[tuple[str, Path]]:
    """llama-server on the same GGUF file as the llama.cpp peer (the suite only: --ar leaves it out)."""
    explicit = args.peers != "all"
    if args.ar:
        if explicit:
            raise EdgeError("--peers llama-server runs in the suite (its plain, n-gram and draft-model modes); "
                            "with --ar use --peers llama.cpp")
        return []
    binary = llama_server.find_binary(args.llama_server)
    if binary is None:
        if explicit:
            raise EdgeError("--peers llama-server needs llama.cpp's llama-server: build it with cmake from llama.cpp's "
                            "source (--target llama-server) and pass --llama-server PATH")
        print("edge-bench: llama-server skipped (pass --llama-server PATH to include it)", file=sys.stderr)
        return []
    os.environ["EDGE_LLAMA_SERVER"] = str(binary)  # for the suite's worker process
    index = gguf_index(model)
    return [("llama-server", Path(index["file"]) if index is not None else matching_gguf(args, model))]


def matching_gguf(args: argparse.Namespace, model: Path) -> Path:
    """The checkpoint converted by llama.cpp's own tools at the precision matching edge's weights (cached)."""
    precision = llama_cpp.matching_precision(model, args.dtype, args.weights)
    return llama_cpp.converted(model, precision, args.llama_cpp_source, log=lambda line: print(line, file=sys.stderr))


def _library_peer_runs(args: argparse.Namespace, model: Path, wanted: set[str]) -> list[tuple[str, Path]]:
    """transformers on the checkpoint, llama.cpp (llama-cpp-python) on its GGUF file."""
    if not wanted:
        return []
    index = gguf_index(model)
    if index is not None and "transformers" in wanted:
        if args.peers != "all":
            raise EdgeError("--peers transformers runs checkpoint folders; for a .gguf file use --peers llama.cpp")
        wanted.discard("transformers")
        print("edge-bench: transformers skipped (it runs checkpoint folders, not .gguf files)", file=sys.stderr)
    if index is not None and "llama.cpp" in wanted:
        if not llama_cpp.available():
            raise EdgeError("--peers llama.cpp needs llama-cpp-python: pip install 'edge[peers]'")
        return [("llama.cpp", Path(index["file"]))]
    runs = [("transformers", model)] if "transformers" in wanted else []
    if "llama.cpp" in wanted:
        if not llama_cpp.available():
            if args.peers != "all":
                raise EdgeError("--peers llama.cpp needs llama-cpp-python: pip install 'edge[peers]'")
            print("edge-bench: llama.cpp skipped (pip install 'edge[peers]' to include it)", file=sys.stderr)
        else:
            runs.append(("llama.cpp", matching_gguf(args, model)))
    return runs


def edge_weights(backend: str, model: Path, args: argparse.Namespace) -> str | None:
    """--weights applies to edge on a checkpoint folder (a bundle brings its own)."""
    return args.weights if backend == "edge" and model.is_dir() else None


def run_worker(backend: str, model: Path, args: argparse.Namespace, prompt_ids: list[int]) -> dict:
    spec = {"backend": backend, "model": str(model), "weights": edge_weights(backend, model, args)}
    return run_child("bench.worker:measure", worker_request([spec], args, prompt_ids), backend)[0]


def worker_request(specs: list[dict], args: argparse.Namespace, prompt_ids: list[int]) -> dict:
    """What bench.worker.measure runs: `specs` ({"backend", "model", "weights"}) on the prompt, timed in turns."""
    return {"runs": specs, "prompt_ids": prompt_ids, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats}


def run_interleaved_workers(runs: list[tuple[str, Path]], args: argparse.Namespace, prompt_ids: list[int]
                            ) -> list[dict]:
    """Every backend in one worker process, timed in turns; each gets the median of its per-repeat ratios to the
    first backend (`ratio`), the steadiest comparison on a machine whose speed drifts."""
    specs = [{"backend": backend, "model": str(path), "weights": edge_weights(backend, path, args)}
             for backend, path in runs]
    results = run_child("bench.worker:measure", worker_request(specs, args, prompt_ids), "interleaved run")
    first = results[0]["decode_tokens_per_s_by_repeat"]
    for result in results:
        result["ratio"] = statistics.median(rate / base for rate, base in
                                            zip(result["decode_tokens_per_s_by_repeat"], first))
    return results


def machine_description() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, " \
           f"torch {torch.__version__}, Python {platform.python_version()}"


def markdown_table(report: dict) -> str:
    rows = [
        "| backend | decode tokens/s | prefill tokens/s | first token s | peak RSS MiB | load s | same tokens |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    base = report["results"][0]["decode_tokens_per_s"]
    shared_process = report.get("interleaved", False)
    for r, same, agree in zip(report["results"], report["identical_to_first"], report["agreeing_prefix"]):
        sameness = "yes" if same else f"first {agree} of {r['new_tokens']}"
        ratio = r.get("ratio", r["decode_tokens_per_s"] / base)
        rss = "shared" if shared_process else f"{r['peak_rss_mib']:.0f}"
        rows.append(f"| {r['backend']} | {r['decode_tokens_per_s']:.1f} ({ratio:.2f}x) | "
                    f"{r['prefill_tokens_per_s']:.0f} | {r['first_token_s']:.3f} | {rss} | "
                    f"{r['load_s']:.2f} | {sameness} |")
    rows.append("")
    rows.append(f"same tokens: greedy output equals the first row's, or how many leading tokens agree (another "
                f"runtime's rounding flips near-ties, and quantized weights differ more); "
                f"{report['results'][0]['new_tokens']} new tokens, prompt {report['results'][0]['prompt_tokens']} "
                f"tokens, {report['dtype']}, {report['machine']}")
    if shared_process:
        rows.append(f"peak RSS: {report['results'][-1]['peak_rss_mib']:.0f} MiB for all runs together (interleaved "
                    f"runs share one process; run without --interleave for each one's own)")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
