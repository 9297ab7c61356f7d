"""How close edge and llama.cpp come to the model a GGUF file holds: each runtime's next-token distributions on real
text against the file's model computed exactly (bench/gguf_reference.py: every tensor dequantized, float64
activations), as the mean and 99th percentile of KL(exact || runtime) and the share of positions whose most likely
token agrees. The mean is also given past each window's first position: there, with no context, a model's
activations can hold a few values far above the rest, which 8-bit blocks resolve worst.

    python -m bench.fidelity [FILE.gguf ...] [--tokens 2048] [--context 512] [--rows 16] \\
        [--runtime edge] [--runtime llama.cpp[:NAME=DIR]] [--eight-bit] [--keep DIR]

The text is the prose of Python's own documentation topics (`pydoc_data.topics`, as bench.perplexity reads it:
offline and the same everywhere), encoded with the file's tokenizer and cut into --tokens / --context windows, each
evaluated from an empty cache (after the file's BOS token where the file asks for one); every position of every
window counts. edge is fed each window --rows tokens per call (its decode and verify passes), and again each window
in one call (a prompt); llama.cpp (llama-cpp-python, its defaults: a float16 KV cache) each window in one batch.
A runtime is `edge`, `edge:PATH` (EDGE_CPU_KERNEL=PATH), `llama.cpp` (llama_cpp as this Python imports it) or
`llama.cpp:NAME=DIR`: DIR (a folder list, os.pathsep between) goes first on the child's PYTHONPATH, and where DIR is
llama-cpp-python's source tree with a build in vendor/llama.cpp/build/bin, LLAMA_CPP_LIB_PATH points there. Default:
edge and llama.cpp. Every runtime, and the exact model, runs in a process of its own, one after another. Below the
table, each edge row's mean KLs and top-1 agreement minus each llama.cpp row's on the same positions, with the
standard errors of the KL differences.

--eight-bit also computes the exact model with every matmul's input quantized to 8 bits as both runtimes quantize it
(per block of 32, per 256 for the k-quants): its row says what the activation blocks alone cost. Compare it with the
runtimes' rows in size, not position by position: a code is decided by an input's last bits (a near tie goes one way
in float32 and the other in float64), and one code rounded the other way changes the next layer's inputs enough to
move many more, so after a few layers a runtime and this model are two draws of the same rounding.

--keep DIR keeps every logits file there and reuses it on a later run over the same file, text and windows (the exact
model of a 1.5B file takes minutes; its logits in float64 take 8 bytes * tokens * vocabulary).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from bench.arguments import bench_parser
from bench.process import WorkerError, peak_rss_mib, run_child

PROG = "python -m bench.fidelity"
COMPARED_ROWS = 128  # positions whose distributions are compared at a time


# ---- the text ---------------------------------------------------------------------------------------------------


def evaluation_windows(path: str, tokens: int, context: int) -> list[list[int]]:
    """tokens // context windows of `context` token ids each: the documentation's text in order, encoded with the
    file's tokenizer, each window after the file's BOS token where the file adds one."""
    from gguf import GGUFReader

    from bench.gguf_reference import read_numbers
    from bench.perplexity import evaluation_text
    from edge.frontend.options import resolve_model_path
    from edge.text.tokenizer import Tokenizer

    numbers = read_numbers(GGUFReader(path))
    bos = [numbers.bos_id] if numbers.add_bos else []
    per_window, count = context - len(bos), tokens // context
    if count < 1:
        raise SystemExit(f"{PROG}: --tokens {tokens} is less than one window of --context {context}")
    text = evaluation_text()[:per_window * count * 16]  # enough characters: a token is far shorter than 16 of them
    ids = Tokenizer.from_dir(resolve_model_path(path)).encode(text, add_special_tokens=False)
    if len(ids) < per_window * count:
        raise SystemExit(f"{PROG}: the text gives {len(ids)} tokens, fewer than {per_window * count}")
    return [bos + ids[i * per_window:(i + 1) * per_window] for i in range(count)]


# ---- logits files: (positions, vocabulary) arrays, written window by window -------------------------------------


@contextmanager
def rows_file(path: str, shape: tuple[int, int], dtype: np.dtype):
    """A .npy file of `shape` written in order by write(rows) calls (nothing of it is held in memory)."""
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                      "fortran_order": False, "shape": shape})
        written = [0]

        def write(rows: np.ndarray) -> None:
            np.ascontiguousarray(rows, dtype=dtype).tofile(handle)  # no copy of rows already of this type
            written[0] += rows.shape[0]

        yield write
    if written[0] != shape[0]:
        raise RuntimeError(f"{path}: {written[0]} rows written of {shape[0]}")


def measured(work):
    """`work(task)` as a child's work: its result with the seconds it took and the process's peak memory."""
    @functools.wraps(work)
    def run(task: dict) -> dict:
        began = time.perf_counter()
        result = work(task) or {}
        return {**result, "seconds": time.perf_counter() - began, "peak_rss_mib": peak_rss_mib()}
    return run


# ---- the child processes' work ------------------------------------------------------------------------------------


@measured
def exact_logits(task: dict) -> None:
    """The file's exact model (bench/gguf_reference.py) on the windows, float64, with 8-bit inputs if asked."""
    from bench.gguf_reference import FileModel

    torch.set_num_threads(task["threads"])
    model = FileModel(task["model"])
    logits = model.logits(torch.tensor(task["windows"]), eight_bit=task["eight_bit"])  # (W * T, V)
    with rows_file(task["out"], logits.shape, np.float64) as write:
        write(logits)


@measured
def edge_logits(task: dict) -> dict:
    """edge's logits (float32) on the windows, each from a new cache, fed task["rows"] tokens per call (None: the
    whole window in one)."""
    from edge.engine import Engine

    windows = torch.tensor(task["windows"])  # (W, T)
    count, steps = windows.shape
    model = Engine.load(task["model"], max_context=steps).model
    rows = task["rows"] or steps
    with torch.inference_mode(), rows_file(task["out"], (count * steps, model.config.vocab_size), np.float32) as write:
        for window in windows:
            cache = model.new_cache(steps)
            for start in range(0, steps, rows):
                write(model.forward_logits(window[None, start:start + rows], start, cache)[0].float().numpy())
    return {"fused_format": model.runner.fused_format}


@measured
def llama_cpp_logits(task: dict) -> dict:
    """llama.cpp's logits (float32) on the windows, each in one batch from an empty cache."""
    from llama_cpp import Llama

    steps = len(task["windows"][0])
    llm = Llama(model_path=task["model"], n_ctx=steps, n_batch=steps, n_ubatch=steps, logits_all=True,
                n_threads=task["threads"], n_threads_batch=task["threads"], verbose=False)
    with rows_file(task["out"], (len(task["windows"]) * steps, llm.n_vocab()), np.float32) as write:
        for window in task["windows"]:
            llm.reset()
            llm.eval(window)
            write(llm.scores[:steps])
    return {}


def llama_cpp_found(task: dict) -> dict:
    """Which llama_cpp the child imports (its error, where it cannot)."""
    import llama_cpp

    return {"version": llama_cpp.__version__, "path": str(Path(llama_cpp.__file__).parent)}


# ---- runtimes -----------------------------------------------------------------------------------------------------


def runtime_environment(spec: str) -> tuple[str, dict[str, str]]:
    """A --runtime spec -> (edge or llama.cpp, what its child's environment adds)."""
    kind, _, rest = spec.partition(":")
    if kind == "edge":
        return kind, {"EDGE_CPU_KERNEL": rest} if rest else {}
    if kind != "llama.cpp" or (rest and "=" not in rest):
        raise SystemExit(f"{PROG}: runtime {spec!r}: use edge, edge:PATH, llama.cpp or llama.cpp:NAME=DIR")
    if not rest:
        return kind, {}
    folders = rest.partition("=")[2]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [folders, os.environ.get("PYTHONPATH")]))}
    first = Path(folders.split(os.pathsep)[0])
    build = first / "vendor" / "llama.cpp" / "build" / "bin"
    if not (first / "llama_cpp" / "lib").is_dir() and (build / "libllama.so").is_file():
        env["LLAMA_CPP_LIB_PATH"] = str(build)
    return kind, env


def check_llama_cpp(spec: str, env: dict[str, str]) -> None:
    """Stop with one line where the runtime's llama_cpp cannot be imported; else say which one runs."""
    try:
        found = run_child("bench.fidelity:llama_cpp_found", {}, spec, prog=PROG, env=env, timeout_s=120)
    except WorkerError as error:
        raise SystemExit(f"{PROG}: {spec}: llama_cpp cannot be imported ({error.last_line}); install "
                         "llama-cpp-python or name one with --runtime llama.cpp:NAME=DIR") from None
    print(f"{spec}: llama-cpp-python {found['version']} from {found['path']}", file=sys.stderr)


def phases(runtimes: list[str], rows: int, eight_bit: bool) -> list[tuple[str, str, dict, dict[str, str]]]:
    """What runs for one file, in order: (label, work, task fields, environment), the exact model first."""
    found = [("exact model", "exact_logits", {"eight_bit": False}, {})]
    if eight_bit:
        found.append(("exact model, 8-bit activations", "exact_logits", {"eight_bit": True}, {}))
    for spec in runtimes:
        kind, env = runtime_environment(spec)
        name = spec.partition("=")[0]
        if kind == "edge":
            found.append((f"{name} ({rows}-row calls)", "edge_logits", {"rows": rows}, env))
            found.append((f"{name} (whole window)", "edge_logits", {"rows": None}, env))
        else:
            found.append((name, "llama_cpp_logits", {}, env))
    return found


def file_key(path: str, windows: list[list[int]]) -> str:
    """What a kept logits file depends on: the model file (path, size, modification time) and the windows."""
    stat = Path(path).stat()
    text = json.dumps([str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, windows])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def computed_logits(path: str, windows: list[list[int]], folder: Path, threads: int, rows: int,
                    runtimes: list[str], eight_bit: bool) -> dict[str, dict]:
    """label -> {"file": its logits (.npy), "seconds", "peak_rss_mib"} for every phase, each in its own process
    (a file already in `folder` is reused)."""
    key, results = file_key(path, windows), {}
    for label, work, fields, env in phases(runtimes, rows, eight_bit):
        slug = "".join(c if c.isalnum() else "-" for c in label)
        out = folder / f"{Path(path).stem}-{key}-{slug}.npy"
        if out.is_file():
            print(f"{label}: reusing {out}", file=sys.stderr)
            results[label] = {"file": str(out)}
            continue
        task = {"model": str(Path(path).resolve()), "windows": windows, "threads": threads, "out": str(out), **fields}
        done = run_child(f"bench.fidelity:{work}", task, label, prog=PROG, env=env)
        print(f"{label}: {done['seconds']:.0f} s, peak memory {done['peak_rss_mib']:.0f} MiB", file=sys.stderr)
        results[label] = {"file": str(out), **done}
    return results


# ---- the measures -------------------------------------------------------------------------------------------------


def divergences(reference: np.ndarray, runtime: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position (rows of the (N, V) logits): KL(reference || runtime) in nats, from each one's log_softmax in
    float64, and whether their most likely tokens agree -> (N,) float64, (N,) bool."""
    if reference.shape != runtime.shape:
        raise SystemExit(f"{PROG}: logits of shape {runtime.shape} against the exact model's {reference.shape}")
    kl, agree = [], []
    for first in range(0, reference.shape[0], COMPARED_ROWS):
        rows = slice(first, first + COMPARED_ROWS)
        p = torch.log_softmax(torch.from_numpy(np.array(reference[rows], dtype=np.float64)), dim=-1)  # (n, V)
        q = torch.log_softmax(torch.from_numpy(np.array(runtime[rows], dtype=np.float64)), dim=-1)  # (n, V)
        kl.append((p.exp() * (p - q)).sum(dim=-1).numpy())
        agree.append((p.argmax(dim=-1) == q.argmax(dim=-1)).numpy())
    return np.concatenate(kl), np.concatenate(agree)


def summary(kl: np.ndarray, agree: np.ndarray, steps: int | None = None) -> dict:
    """The measures of one runtime over all positions, and its mean KL past each window's first position (the one
    with no context; windows of `steps` positions, default one window), and the per-position KL and agreement (for
    paired())."""
    later = np.arange(kl.size) % (steps or kl.size) != 0  # (N,)
    return {"positions": int(kl.size), "mean_kl": float(kl.mean()), "later_mean_kl": float(kl[later].mean()),
            "p99_kl": float(np.percentile(kl, 99)), "top1": float(agree.mean()), "kl": kl, "agree": agree,
            "later": later, "steps": steps or kl.size}


def paired(first: dict, second: dict) -> dict[str, float]:
    """first's mean KL (over all positions and past each window's first) and top-1 agreement minus second's on the
    same positions, with the standard errors of the KL differences: positions taken as independent, and windows
    taken as the independent units (a code rounded the other way stays in a window's cache and moves every later
    position of it, so neighbours are not independent: the window's error is the honest one, nan for one window),
    and in how many windows `first` is the closer past the first position."""
    difference, later = first["kl"] - second["kl"], first["later"]  # (N,), (N,) bool
    error = lambda values: float(values.std() / np.sqrt(values.size))  # noqa: E731
    windows = difference.reshape(-1, first["steps"])[:, 1:].mean(axis=1) if first["steps"] > 1 else difference
    window_error = float(windows.std(ddof=1) / np.sqrt(windows.size)) if windows.size > 1 else float("nan")
    return {"mean_kl": float(difference.mean()), "standard_error": error(difference),
            "later_mean_kl": float(difference[later].mean()), "later_standard_error": error(difference[later]),
            "later_window_standard_error": window_error, "windows": int(windows.size),
            "windows_closer": int((windows < 0).sum()), "top1": float(first["agree"].mean() - second["agree"].mean())}


def perplexity(reference: np.ndarray, windows: list[list[int]]) -> float:
    """The exact model's perplexity on the windows' text: every position but a window's last predicts the next."""
    steps, total, count = len(windows[0]), 0.0, 0
    for w, window in enumerate(windows):
        logits = torch.from_numpy(np.array(reference[w * steps:(w + 1) * steps - 1], dtype=np.float64))  # (T-1, V)
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum").item()
        count += steps - 1
    return float(np.exp(total / count))


def measures(logits: dict[str, dict], windows: list[list[int]]) -> tuple[float, dict[str, dict]]:
    """(the exact model's perplexity, label -> the summary against it)."""
    exact = np.load(logits["exact model"]["file"], mmap_mode="r")
    found = {label: summary(*divergences(exact, np.load(run["file"], mmap_mode="r")), len(windows[0]))
             for label, run in logits.items() if label != "exact model"}
    return perplexity(exact, windows), found


# ---- the command ------------------------------------------------------------------------------------------------


def table_row(name: str, label: str, row: dict) -> str:
    return (f"| {name} | {label} | {row['positions']} | {row['mean_kl']:.5f} | {row['later_mean_kl']:.5f} | "
            f"{row['p99_kl']:.4f} | {row['top1']:.2%} |")


def differences(name: str, found: dict[str, dict]) -> list[tuple[str, dict]]:
    """Each edge row against each llama.cpp row of one file: (what is compared, paired())."""
    return [(f"{name}: {ours} against {theirs}", paired(found[ours], found[theirs]))
            for ours in found if ours.startswith("edge") for theirs in found if theirs.startswith("llama.cpp")]


def difference_line(label: str, difference: dict) -> str:
    return (f"{label}: mean KL {difference['mean_kl']:+.5f} (standard error {difference['standard_error']:.5f}), "
            f"past the first positions {difference['later_mean_kl']:+.5f} ({difference['later_standard_error']:.5f}; "
            f"by window {difference['later_window_standard_error']:.5f}, closer in {difference['windows_closer']} of "
            f"{difference['windows']} windows), top-1 agreement {100 * difference['top1']:+.2f} points")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(PROG, __doc__, tokens={"default": 2048, "help": "tokens evaluated per file (default 2048)"},
                          context={"default": 512, "help": "tokens per window (default 512)"},
                          threads={"default": os.cpu_count(), "help": "threads of the exact model and llama.cpp"},
                          json={"help": "also write the measures here (JSON)"})
    parser.add_argument("files", nargs="*", help=".gguf files (default: the default model's file)")
    parser.add_argument("--runtime", action="append", help="edge, edge:PATH, llama.cpp or llama.cpp:NAME=DIR "
                                                           "(repeatable; default: edge and llama.cpp)")
    parser.add_argument("--rows", type=int, default=16, help="tokens per edge call (default 16)")
    parser.add_argument("--eight-bit", action="store_true",
                        help="also the exact model with 8-bit activation blocks, as the runtimes compute")
    parser.add_argument("--keep", type=Path, help="keep the logits files here and reuse them")
    args = parser.parse_args(argv)
    if args.tokens < args.context:
        parser.error(f"--tokens {args.tokens} is less than one window of --context {args.context}")
    runtimes = args.runtime or ["edge", "llama.cpp"]
    for spec in runtimes:
        kind, env = runtime_environment(spec)
        if kind == "llama.cpp":
            check_llama_cpp(spec, env)
    files = args.files or [str(default_file())]
    print("| file | runtime | tokens | mean KL (nats) | past each window's first token | p99 KL | top-1 agreement |")
    print("|---|---|---:|---:|---:|---:|---:|")
    report, compared = {}, []
    for path in files:
        windows = evaluation_windows(path, args.tokens, args.context)
        with tempfile.TemporaryDirectory() as scratch:
            folder = args.keep or Path(scratch)
            folder.mkdir(parents=True, exist_ok=True)
            logits = computed_logits(path, windows, folder, args.threads, args.rows, runtimes, args.eight_bit)
            exact_perplexity, found = measures(logits, windows)
        print("\n".join(table_row(Path(path).name, label, row) for label, row in found.items()), flush=True)
        pairs = differences(Path(path).name, found)
        compared += pairs
        report[path] = {"windows": len(windows), "context": args.context, "perplexity": exact_perplexity,
                        "runtimes": {label: {k: v for k, v in row.items() if k not in ("kl", "agree", "later")}
                                     for label, row in found.items()},
                        "differences": dict(pairs),
                        "runs": {label: {k: v for k, v in run.items() if k != "file"} for label, run in logits.items()}}
        print(f"{Path(path).name}: {len(windows)} x {args.context}-token windows; the exact model's perplexity "
              f"{exact_perplexity:.3f}", file=sys.stderr)
    if compared:
        print("\nPaired over the same positions:\n\n" + "\n".join(f"- {difference_line(*pair)}" for pair in compared))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def default_file() -> Path:
    from edge.sources.default_model import packaged_file

    path = packaged_file()
    if path is None:
        raise SystemExit(f"{PROG}: name a .gguf file (the default model's package is not installed)")
    return path


if __name__ == "__main__":
    sys.exit(main())
