"""llama.cpp as a peer in edge-bench, through llama-cpp-python (`pip install 'edge[peers]'`, which builds llama.cpp
from source: about 7 minutes on 2 cores; CMAKE_ARGS picks its instruction set).

    gguf = converted(checkpoint, "q4_0")       # llama.cpp's converter (and quantizer for q4_0), cached
    run = llama_cpp_runner(gguf, prompt_ids)   # greedy generation of N tokens from the same token ids as edge

The checkpoint is converted at the precision matching edge's weights (`matching_precision`): float32 -> f32, 16-bit
-> f16, `--weights int8` -> q8_0, `--weights int4` -> q4_0. f32, f16 and q8_0 come straight from
convert_hf_to_gguf.py; q4_0 is llama.cpp's quantizer (llama_model_quantize) applied to the f32 file with `pure` set,
so that every matrix, the output head included, is q4_0 as edge's int4 quantizes every matrix and its head (by
default llama.cpp keeps the head at a higher precision). The converter is llama.cpp's own, taken from a source tree:
--llama-cpp-source DIR or EDGE_LLAMA_CPP_SOURCE, else the llama-cpp-python sdist of the installed version,
downloaded once from the package index into the cache (its vendor/llama.cpp).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.process import WorkerError, run_child
from edge.errors import EdgeError
from edge.kernels.cache import cache_folder

GGUF_TYPES = {"float32": "f32", "float16": "f16", "bfloat16": "f16", "int8": "q8_0", "int4": "q4_0"}
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py")


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def matching_precision(checkpoint: Path, dtype: str, weights: str | None) -> str:
    """The GGUF type that matches what edge computes with: its packed format, else the dtype it keeps weights in."""
    if weights:
        return GGUF_TYPES[weights]
    from edge.planning import kept_weight_dtype

    return GGUF_TYPES[kept_weight_dtype(checkpoint, dtype, "cpu")]


def converter_source(explicit: str | Path | None = None) -> Path:
    """A llama.cpp source tree holding convert_hf_to_gguf.py (see the module docstring for where it is looked for)."""
    given = explicit or os.environ.get("EDGE_LLAMA_CPP_SOURCE")
    if given:
        root = Path(given)
        if (root / "vendor" / "llama.cpp").is_dir():  # the sdist's top folder
            root = root / "vendor" / "llama.cpp"
        if not all((root / part).exists() for part in CONVERTER_PARTS):
            raise EdgeError(f"{given} holds no llama.cpp converter (convert_hf_to_gguf.py, conversion/, gguf-py/); "
                            "pass a llama.cpp source tree or the llama-cpp-python sdist's vendor/llama.cpp")
        return root
    from importlib.metadata import version

    installed = version("llama-cpp-python")
    root = cache_folder("llama.cpp-source") / installed
    if all((root / part).exists() for part in CONVERTER_PARTS):
        return root
    with tempfile.TemporaryDirectory() as download:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                  "--quiet", "-d", download, f"llama-cpp-python=={installed}"],
                                 capture_output=True, text=True)
        archives = list(Path(download).glob("*.tar.gz"))
        if fetched.returncode != 0 or not archives:
            raise EdgeError(f"could not fetch llama-cpp-python {installed}'s source for llama.cpp's converter; pass "
                            "--llama-cpp-source DIR (a llama.cpp checkout, or the sdist's vendor/llama.cpp)")
        prefix = f"{archives[0].name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(archives[0]) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)
                       and m.name[len(prefix):].split("/")[0] in CONVERTER_PARTS and (m.isfile() or m.isdir())]
            for member in members:
                member.name = member.name[len(prefix):]
            root.mkdir(parents=True, exist_ok=True)
            archive.extractall(root, members=members, filter="data")
    return root


def _checkpoint_key(checkpoint: Path) -> str:
    """A key that changes when the checkpoint's files do (names, sizes, modification times)."""
    files = sorted(p for p in checkpoint.iterdir() if p.is_file())
    text = "\0".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(f"{checkpoint.resolve()}\0{text}".encode()).hexdigest()[:16]


def converted(checkpoint: Path, gguf_type: str, source: str | Path | None = None, log=print) -> Path:
    """The checkpoint as a GGUF file of `gguf_type` (f32, f16, q8_0, q4_0), made once and cached."""
    folder = cache_folder("gguf")
    target = folder / f"{checkpoint.name}-{_checkpoint_key(checkpoint)}-{gguf_type}.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    if gguf_type == "q4_0":
        full = converted(checkpoint, "f32", source, log)
        log(f"edge-bench: quantizing {full.name} to q4_0 with llama.cpp's quantizer ...")
        import llama_cpp

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.pure, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, True, os.cpu_count() or 1
        if llama_cpp.llama_model_quantize(str(full).encode(), str(partial).encode(), params) != 0:
            raise EdgeError(f"llama.cpp could not quantize {full} to q4_0")
    else:
        log(f"edge-bench: converting {checkpoint} to GGUF {gguf_type} with llama.cpp's converter ...")
        request = {"source": str(converter_source(source)), "checkpoint": str(checkpoint), "outfile": str(partial),
                   "outtype": gguf_type}
        try:
            run_child("bench.gguf_convert:convert", request, "llama.cpp's converter")
        except WorkerError as error:
            raise EdgeError(f"llama.cpp's converter failed on {checkpoint}: {error.last_line or 'no output'}") from None
    os.replace(partial, target)
    return target


def load(gguf: str | Path, context: int, threads: int, lookup: int | None = None):
    """llama.cpp's model on the GGUF file; with `lookup`, llama-cpp-python's prompt lookup decoding drafts that many
    tokens per step from the text so far (its own advice: 10 on a GPU, 2 on a CPU alone)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
    return Llama(model_path=str(gguf), n_ctx=context, n_batch=512, n_threads=threads, n_threads_batch=threads,
                 draft_model=draft, verbose=False)


def greedy(llm, prompt_ids: list[int], new_tokens: int, stop: frozenset[int] = frozenset()) -> list[int]:
    """The first `new_tokens` greedy token ids after the prompt, prefilled afresh (no prefix reuse between runs);
    ending after a token in `stop` (edge's end-of-sequence ids), which is kept, as edge keeps it."""
    llm.reset()
    ids: list[int] = []
    for token in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        ids.append(token)
        if len(ids) == new_tokens or token in stop:
            break
    return ids


def llama_cpp_runner(gguf: str, prompt_ids: list[int], max_new_tokens: int, threads: int):
    """run(n) -> the first n greedy token ids after the prompt (end-of-sequence ignored, as edge's ignore_eos)."""
    llm = load(gguf, len(prompt_ids) + max_new_tokens + 8, threads)
    return lambda new_tokens: greedy(llm, prompt_ids, new_tokens)
