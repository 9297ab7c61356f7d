"""Writing a bundle: checkpoint -> ONNX graphs (quantized), trimmed drafter, validation, manifest, then move.

    manifest = export_bundle("ckpt/", "ckpt.bundle", ExportOptions(quant=QuantSettings("int4"), drafter="builtin"))

Everything is written into a temporary folder beside the output (.NAME.partial-XXXX) and moved into place (one
rename, the last step) only after the graphs pass validation, so an interrupted or failed export leaves nothing
half-written behind. The export holds a lock on that folder while it works; a folder of the same output that nobody
holds (its export was killed) is removed by the next export of that output, and the loader refuses such folders by
name. See edge/backends/bundle.py for the layout and for how the runtime checks it.

Validation runs every exported backend through the runtime (`Engine.load(bundle, backend=...)`) and compares with
eager edge:
  - logits over a calibration conversation, one pass each: relative error ||onnx - eager|| / ||eager|| within the
    tolerance of the weight format (TOLERANCE), and top-1 agreement reported;
  - greedy text: eager edge against the bundle (required equal for fp32; reported for the others);
  - speculation: greedy speculative decoding on the bundle equals greedy plain decoding on the bundle (required on
    ONNX whenever the weight format is row-invariant, which every default is; reported for the torch targets,
    whose matmul is not batch-invariant).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import torch

from edge.backends.bundle import MANIFEST, kv_per_token, read_bundle, validating
from edge.text.chat_template import check_template
from edge.model.config import ModelConfig
from edge.decoding.registry import DrafterSpec, load_draft_model
from edge.engine import Engine
from edge.errors import BundleError, EdgeError, TokenizerError, UnsupportedModelError
from edge.sources.gguf_checkpoint import gguf_index
from edge.sources.loading import not_a_folder
from edge.text.tokenizer import Tokenizer
from edge.export.bundle_files import (
    CONFIG_FILES,
    TOKENIZER_FILES,
    TOLERANCE,
    copy_files,
    file_table,
    manifest_head,
    write_chat_template,
    write_manifest,
)
from edge.export.onnx_graph import build_graph
from edge.export.optimum_export import export_with_optimum
from edge.export.progress import StageProgress
from edge.export.quantize import QuantSettings, quantize
from edge.export.vocab_trim import CALIBRATION_PROMPTS, calibrate, prompt_ids
from edge.export.workdir import WorkFolder, remove_stale_work_folders

VALIDATION_TOKENS = 32


FORMATS = ("onnx", "torchscript")  # torchscript also writes the torch.export program of the same step


@dataclass(frozen=True)
class ExportOptions:
    formats: tuple[str, ...] = ("onnx",)  # FORMATS
    quant: QuantSettings = field(default_factory=QuantSettings)  # the ONNX target's weights
    drafter: str | None = None  # "builtin" or a draft checkpoint folder; None: no drafter in the bundle
    vocab_trim: str = "auto"  # VocabTrim: "on", "off", or "auto" (on when the head outweighs the drafter's layers)
    vocab_coverage: float = 0.99  # keep the drafter head rows of the most frequent tokens covering this share
    calibration_text: str | None = None  # extra text whose tokens count towards the kept vocabulary
    calibration_tokens: int = 96  # tokens generated per calibration prompt
    overwrite: bool = False
    chat_template: str | None = None  # the bundle's Jinja chat template (chat_template.jinja), over the checkpoint's
    chat_template_origin: str | None = None  # where it came from (a file path), recorded in the manifest


def export_bundle(checkpoint: str | Path, output: str | Path, options: ExportOptions = ExportOptions(), *,
                  show_progress: bool = True) -> dict:
    """Export `checkpoint` to the bundle folder `output`; return the manifest. Raises EdgeError subclasses."""
    checkpoint, output = Path(checkpoint), Path(output)
    _check_output(output, options.overwrite)
    _check_formats(options)
    if options.chat_template is not None:
        check_template(options.chat_template, options.chat_template_origin or "the chat template")
    unsupported = _unsupported_by_edge(checkpoint)
    stages = 4 + (2 if options.drafter else 0) if unsupported is None else 4
    remove_stale_work_folders(output)
    work = None
    try:  # a stop signal right after the work folder is made still removes it
        work = _make_workdir(output)
        return _export_into(checkpoint, output, work.path, options, unsupported,
                            StageProgress(stages, enabled=show_progress))
    finally:
        if work is not None:
            work.remove()


def _export_into(checkpoint: Path, output: Path, workdir: Path, options: ExportOptions,
                 unsupported: UnsupportedModelError | None, progress: StageProgress) -> dict:
    """The export's stages in `workdir`, then the bundle moved into place at `output`; its manifest."""
    try:
        try:
            if unsupported is None:
                manifest = _export_edge_graphs(checkpoint, workdir, options, progress)
            else:
                manifest = export_with_optimum(checkpoint, workdir, options, progress, unsupported)
            progress.stage("writing the manifest and moving the bundle into place")
            manifest["files"] = file_table(workdir)
            manifest = write_manifest(workdir, manifest)  # with its validation record: a bundle from here on
            _move_into_place(workdir, output)
        except OSError as error:  # a full disk, a folder removed under the export...
            if isinstance(error, EdgeError):
                raise
            raise BundleError(_stopped(error, output)) from None
    except BaseException:
        progress.abort()  # no "done" for the stage that failed or was interrupted
        raise
    finally:
        progress.close()
    return manifest


def _stopped(error: OSError, output: Path) -> str:
    """One line for a file error during the export: what failed, where, that the output is untouched, the fix."""
    where = f" ({error.filename})" if error.filename else ""
    fix = ("free some space, or pass -o a folder on another disk" if error.errno in (errno.ENOSPC, errno.EDQUOT)
           else "fix that and run the export again")
    return f"the export stopped: {error.strerror or error}{where}; nothing was written to {output}; {fix}"


def _make_workdir(output: Path) -> WorkFolder:
    """The temporary folder beside `output` the bundle is written into, locked while the export runs: its first
    write, so an output folder that cannot be written is refused before any work, naming the folder, why, and one
    that can be written."""
    try:
        return WorkFolder.create(output)
    except OSError as error:
        raise BundleError(f"cannot write the bundle to {output}: creating a folder in {output.parent} failed "
                          f"({error.strerror or error}); pass -o a folder you can write to, e.g. -o "
                          f"{_writable_suggestion(output)}") from None


def _writable_suggestion(output: Path) -> Path:
    """`output`'s name in the first writable one of: the working folder, the home folder, the temporary folder."""
    for folder in (Path.cwd(), Path.home(), Path(tempfile.gettempdir())):
        if folder != output.parent and os.access(folder, os.W_OK | os.X_OK):
            return folder / output.name
    return Path.home() / output.name


def _move_into_place(workdir: Path, output: Path) -> None:
    """One rename puts the bundle at `output`. A bundle already there (--overwrite) is renamed aside first and
    removed after, and Ctrl+C waits until that is done: `output` is always the old bundle or the new one."""
    with _interrupts_deferred():
        aside = None
        if output.exists():  # only reached with overwrite=True (checked before any work)
            aside = output.with_name(f".{output.name}.replaced-{os.getpid()}")
            os.replace(output, aside)
        try:
            os.replace(workdir, output)
        except OSError:
            if aside is not None:
                os.replace(aside, output)
            raise
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def _interrupts_deferred():
    """Inside, Ctrl+C (SIGINT), SIGTERM and SIGHUP are held back; once the block is done the export has completed,
    so they are dropped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, lambda signum, frame: None) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _unsupported_by_edge(checkpoint: Path) -> UnsupportedModelError | None:
    """None when edge's model file covers the checkpoint; else the error saying why (optimum may export it)."""
    if not checkpoint.is_dir():
        raise BundleError(not_a_folder(checkpoint))
    try:
        config = ModelConfig.from_dir(checkpoint)
    except UnsupportedModelError as error:
        return error
    if not config.llama_layout:
        return UnsupportedModelError(f"edge's own graphs cover the Llama layout; {config.architecture} (its sandwich "
                                     "norms, GeGLU, local layers or partial rotary) exports through optimum")
    return None


def _export_edge_graphs(checkpoint: Path, workdir: Path, options: ExportOptions, progress: StageProgress) -> dict:
    """Graphs built from edge's own model (edge/export/onnx_graph.py, edge/export/torch_targets.py), validated against it."""
    progress.stage("reading the checkpoint")
    # float32 eager: the reference the graphs are validated against (a GGUF file's blocks dequantized: the graphs'
    # own quantization starts from the values the file holds)
    engine = Engine.load(checkpoint, weights="float16" if gguf_index(checkpoint) is not None else None)
    draft_engine = _load_drafter(options.drafter, engine) if options.drafter else None
    manifest = manifest_head(checkpoint, engine.tokenizer, options)
    progress.stage(f"building the target ({', '.join(options.formats)}; onnx weights {options.quant.weights})")
    files = _write_model(workdir, "target", engine.model, None, options, checkpoint)
    manifest["target"] = {**files, "config_dir": "target", "parameters": _parameters(engine.model)}
    copy_files(checkpoint, workdir, TOKENIZER_FILES)
    write_chat_template(workdir, manifest, engine.tokenizer, options)
    if draft_engine is not None:
        kept = None
        if _should_trim(options.vocab_trim, draft_engine["model"]):
            progress.stage("calibrating the drafter's vocabulary (VocabTrim)")
            kept, trim = calibrate(engine, options.vocab_coverage, max_new_tokens=options.calibration_tokens,
                                   extra_text=options.calibration_text, chat_template=options.chat_template,
                                   progress=lambda done, total: progress.update(done / total))
            manifest["vocab_trim"] = trim
        progress.stage("building the drafter")
        source = Path(draft_engine["path"])
        files = _write_model(workdir, "drafter", draft_engine["model"], kept, options, source)
        manifest["drafter"] = {**files, "config_dir": "drafter", "source": str(source),
                               "parameters": _parameters(draft_engine["model"]),
                               "tokenizer_sha256": draft_engine["tokenizer"].fingerprint()["vocab_sha256"],
                               "vocab_map": None}
        if kept is not None:
            (workdir / "drafter" / "vocab_map.json").write_text(json.dumps({"kept_ids": kept}))
            manifest["drafter"]["vocab_map"] = "drafter/vocab_map.json"
    progress.stage("validating the graphs against eager edge")
    manifest["memory"] = _memory(workdir, manifest, engine, draft_engine)
    manifest["files"] = file_table(workdir)
    write_manifest(workdir, manifest)  # read by the validating engine
    with validating(workdir):
        manifest["validation"] = validate(workdir, engine, draft_engine["model"] if draft_engine else None, options)
    return manifest


def _check_output(output: Path, overwrite: bool) -> None:
    if not output.parent.is_dir():
        raise BundleError(f"the output's parent folder {output.parent} does not exist; create it first")
    if output.exists() and not overwrite:
        raise BundleError(f"{output} already exists; pick another output folder or pass --overwrite")
    if output.exists() and not (output / MANIFEST).is_file():
        raise BundleError(f"{output} exists and is not an edge bundle; refusing to overwrite it (pick another "
                          "output folder)")


def _load_drafter(spec: str, engine) -> dict:
    """The draft checkpoint named by `spec` ("builtin", "draft:PATH" or a folder), checked against the target."""
    drafter_spec = DrafterSpec.parse(spec)
    if drafter_spec is None or not drafter_spec.is_draft_checkpoint():
        raise BundleError(f"--drafter {spec!r} is not a draft model; a bundle carries a separate draft checkpoint "
                          "('builtin' or a folder). ngram needs no export, and layer-skip drafters run on the "
                          "torch backend")
    path = drafter_spec.folder()
    try:
        drafter = load_draft_model(path, engine.model, engine.tokenizer, max_len=64)
    except TokenizerError as error:
        if drafter_spec.kind != "builtin":
            raise
        raise BundleError("--drafter builtin is the built-in model's draft model and drafts only for the built-in "
                          "model (edge/models/default); this model's tokenizer differs. Export without --drafter and "
                          "draft from the prompt when you run it (edge-chat BUNDLE --drafter ngram), or pass "
                          "--drafter a smaller checkpoint of the same family") from None
    return {"model": drafter.model, "path": path, "tokenizer": Tokenizer.from_dir(path)}


def _check_formats(options: ExportOptions) -> None:
    unknown = [name for name in options.formats if name not in FORMATS]
    if unknown or not options.formats:
        raise ValueError(f"unknown target format {unknown[0] if unknown else ''!r}; choose from {', '.join(FORMATS)}")
    if "onnx" not in options.formats and options.quant.weights != "fp32":
        raise ValueError(f"--weights {options.quant.weights} applies to the ONNX target; the TorchScript target "
                         "stores float32 (use --format both, or --weights fp32)")


def _write_model(root: Path, part: str, model, head_rows: list[int] | None, options: ExportOptions,
                 source: Path) -> dict:
    """Write `part` ("target" or "drafter") in every requested format; return its manifest entries."""
    from edge.export.torch_targets import KVStep, save_exported, save_torchscript

    folder = root / part
    folder.mkdir(parents=True)
    rows = torch.tensor(head_rows, dtype=torch.long) if head_rows is not None else None
    files = {}
    if "onnx" in options.formats:
        onnx.save(quantize(build_graph(model, head_rows=rows), options.quant), str(folder / "model.onnx"))
        files["onnx"] = f"{part}/model.onnx"
    if "torchscript" in options.formats:
        step = KVStep(model, head_rows=rows).eval()
        save_torchscript(step, folder / "model.ts")
        save_exported(step, folder / "model.pt2")
        files.update(torchscript=f"{part}/model.ts", torch_export=f"{part}/model.pt2")
    copy_files(source, folder, CONFIG_FILES)
    return files


def _should_trim(setting: str, drafter) -> bool:
    """auto: trim when the head has more parameters than the drafter's layers. Below that, a drafter step is mostly
    its layers and call overhead, and the rows a trim drops cost acceptance for little speed (measured on the
    built-in pair: docs/history/benchmarks-2026-11-21.md)."""
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"vocabulary trim must be auto, on or off, got {setting!r}")
    if setting != "auto":
        return setting == "on"
    head = drafter.head_weight.numel()
    return head > sum(p.numel() for p in drafter.layers.parameters())


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _memory(workdir: Path, manifest: dict, engine, draft_engine: dict | None) -> dict:
    """What the planner needs: bytes of each part's weights file (the default backend's) and KV cache bytes per
    position (float32 cache)."""
    def weights_file(part: str) -> int:
        entry = manifest[part]
        return (workdir / (entry.get("onnx") or entry["torchscript"])).stat().st_size

    memory = {"target_weights_bytes": weights_file("target"),
              "target_kv_bytes_per_token": kv_per_token(engine.model.config),
              "max_context": engine.model.config.max_position_embeddings}
    if draft_engine is not None:
        memory["drafter_weights_bytes"] = weights_file("drafter")
        memory["drafter_kv_bytes_per_token"] = kv_per_token(draft_engine["model"].config)
    return memory


def validate(bundle_dir: Path, engine, draft_model, options: ExportOptions) -> dict:
    """Compare every backend of the bundle with eager edge (see the module docstring); raise BundleError when one
    is out of tolerance. Returns {"sequence_tokens": n, backend: {...}} for each backend."""
    # a chat of one calibration request in the bundle's template (a base model without one: the request as text)
    prompt = prompt_ids(engine.tokenizer, CALIBRATION_PROMPTS[0], options.chat_template)
    reference_text = "".join(e.text for e in engine.generate(prompt, max_new_tokens=VALIDATION_TOKENS,
                                                               speculate=False, temperature=0.0))
    sequence = engine.history  # prompt + greedy reply: the teacher-forced validation sequence
    engine.reset()
    report: dict = {"sequence_tokens": len(sequence)}
    for backend in read_bundle(bundle_dir, verify=False).backends():
        weights = options.quant.weights if backend == "onnx" else "fp32"
        exact = options.quant.row_invariant if backend == "onnx" else False  # torch's matmul: not batch-invariant
        report[backend] = _validate_backend(bundle_dir, backend, engine, draft_model, prompt, sequence,
                                            reference_text, weights, exact)
    return report


def _validate_backend(bundle_dir: Path, backend: str, engine, draft_model, prompt: list[int],
                      sequence: list[int], reference_text: str, weights: str, exact: bool) -> dict:
    drafter = "bundle" if draft_model is not None else "ngram"
    bundled = Engine.load(bundle_dir, max_context=len(sequence) + VALIDATION_TOKENS + 16, drafter=drafter,
                          backend=backend)
    if prompt_ids(bundled.tokenizer, CALIBRATION_PROMPTS[0]) != prompt:  # the bundle's own files render it
        raise BundleError("validation failed: the bundle's tokenizer and chat template encode the validation chat "
                          "differently from the export's; nothing was written (please report this as a bug)")
    tolerance = TOLERANCE[weights]
    report = {"weights": weights, "tolerance": tolerance,
              "target": _compare_logits(engine.model, bundled.model, sequence, tolerance, f"{backend} target")}
    if draft_model is not None:
        report["drafter"] = _compare_logits(draft_model, bundled.drafter.model, sequence, tolerance,
                                            f"{backend} drafter")
    plain_text = "".join(e.text for e in bundled.generate(prompt, max_new_tokens=VALIDATION_TOKENS,
                                                           speculate=False, temperature=0.0))
    plain_history = bundled.history
    report["greedy_text_identical"] = plain_text == reference_text
    if weights == "fp32" and not report["greedy_text_identical"]:
        raise BundleError(f"validation failed: the {backend} target's greedy text differs from eager edge's; nothing "
                          "was written (please report this as a bug)")
    bundled.reset()
    speculative_text = "".join(e.text for e in bundled.generate(prompt, max_new_tokens=VALIDATION_TOKENS,
                                                                 temperature=0.0))
    identical = bundled.history == plain_history and speculative_text == plain_text
    report["speculative_equals_plain"] = {"drafter": drafter, "identical": identical, "guaranteed": exact}
    if exact and not identical:
        raise BundleError(f"validation failed: greedy speculative decoding on the {backend} target differs from plain "
                          "decoding on it; nothing was written (please report this as a bug)")
    return report


def _compare_logits(eager, exported, sequence: list[int], tolerance: float, part: str) -> dict:
    tokens = torch.tensor([sequence])  # (1, S)
    with torch.inference_mode():
        expected = eager.logits(eager(tokens, 0, eager.new_cache(len(sequence))))[0]  # (S, V)
        got = exported.logits(exported(tokens, 0, exported.new_cache(len(sequence))))[0]  # (S, V)
    vocab_map = getattr(exported, "vocab_map", None)
    if vocab_map is not None:  # a trimmed head: compare the rows it kept
        expected, got = expected[:, vocab_map], got[:, vocab_map]
    error = float((got - expected).norm() / expected.norm())
    agreement = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
    result = {"relative_error": float(f"{error:.3g}"), "top1_agreement": round(agreement, 4),
              "max_abs_diff": float(f"{float((got - expected).abs().max()):.3g}")}
    if not error <= tolerance:
        raise BundleError(f"validation failed: the {part} graph's logits differ from eager edge by {error:.4f} "
                          f"(relative), above the {tolerance} allowed for these weights; nothing was written "
                          "(try a smaller --block-size or int8)")
    return result
