"""The target of an architecture edge's model file does not cover, exported by optimum (`text-generation-with-past`)
and run by edge/backends/optimum_backend.py through the same engine, cache and drafters (n-gram; a draft model needs a
graph edge builds).

Validation compares with transformers' eager model, the only reference for these architectures: logits over a
prompt and its greedy continuation, greedy text (identical for fp32), and n-gram speculation against plain
decoding on the bundle.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import onnx
import torch

from edge.engine import Engine
from edge.errors import BundleError, UnsupportedModelError
from edge.text.tokenizer import Tokenizer
from edge.backends.bundle import kv_per_token, validating
from edge.export.bundle_files import (CONFIG_FILES, TOKENIZER_FILES, TOLERANCE, copy_files, file_table,
                                      manifest_head, write_chat_template, write_manifest)
from edge.export.progress import StageProgress
from edge.export.quantize import quantize

VALIDATION_PROMPT = "def fibonacci(n):"
VALIDATION_TOKENS = 24
LARGE_GRAPH_BYTES = 1_500_000_000  # above this, weights go to an external data file (protobuf's 2 GB limit)


def export_with_optimum(checkpoint: Path, workdir: Path, options, progress: StageProgress,
                        unsupported: UnsupportedModelError) -> dict:
    try:
        from optimum.exporters.onnx import main_export
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise BundleError(f"{unsupported}; edge-export can export it through optimum: pip install 'edge[export]' "
                          "(optimum-onnx)") from None
    if options.formats != ("onnx",):
        raise BundleError(f"{unsupported}; only the ONNX target can be exported for it (through optimum)")
    if options.drafter:
        raise BundleError(f"{unsupported}; its bundle cannot carry a draft model yet (use ngram drafting)")

    progress.stage("exporting with optimum (text-generation-with-past)")
    staging = workdir / "optimum"
    try:
        with warnings.catch_warnings(), _quiet_loggers("transformers", "optimum", "torch.onnx"):
            warnings.simplefilter("ignore")  # tracer warnings about the reference model's Python branches
            main_export(str(checkpoint), output=str(staging), task="text-generation-with-past", device="cpu")
    except Exception as error:  # optimum raises many kinds; the user needs one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BundleError(f"optimum could not export {checkpoint}: {first}") from None
    target = workdir / "target"
    target.mkdir()
    progress.stage(f"quantizing the target ({options.quant.weights})")
    graph = quantize(onnx.load(str(staging / "model.onnx")), options.quant)
    external = graph.ByteSize() > LARGE_GRAPH_BYTES
    onnx.save(graph, str(target / "model.onnx"), save_as_external_data=external, location="model.onnx.data")
    shutil.rmtree(staging)
    copy_files(checkpoint, target, CONFIG_FILES)
    copy_files(checkpoint, workdir, TOKENIZER_FILES)

    tokenizer = Tokenizer.from_dir(checkpoint)
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    manifest = manifest_head(checkpoint, tokenizer, options)
    write_chat_template(workdir, manifest, tokenizer, options)
    manifest["target"] = {"onnx": "target/model.onnx", "graph": "optimum", "config_dir": "target",
                          "architecture": reference.config.model_type,
                          "parameters": sum(p.numel() for p in reference.parameters())}
    if external:
        manifest["target"]["onnx_data"] = "target/model.onnx.data"
    progress.stage("validating against transformers")
    manifest["files"] = file_table(workdir)
    write_manifest(workdir, manifest)  # read by the validating engine
    with validating(workdir):
        manifest["validation"], manifest["memory"] = validate_optimum(workdir, reference, tokenizer, options)
    return manifest


def validate_optimum(bundle_dir: Path, reference, tokenizer: Tokenizer, options) -> tuple[dict, dict]:
    prompt = tokenizer.encode(VALIDATION_PROMPT, add_special_tokens=True)
    with torch.inference_mode():
        generated = reference.generate(torch.tensor([prompt]), max_new_tokens=VALIDATION_TOKENS, do_sample=False,
                                       min_new_tokens=VALIDATION_TOKENS, pad_token_id=0)[0].tolist()
        expected = reference(torch.tensor([generated])).logits[0]  # (S, V)
    bundled = Engine.load(bundle_dir, max_context=len(generated) + VALIDATION_TOKENS + 8, drafter="ngram")
    model = bundled.model
    got = model.logits(model(torch.tensor([generated]), 0, model.new_cache(len(generated))))[0]  # (S, V)
    weights = options.quant.weights
    error = float((got - expected).norm() / expected.norm())
    report = {"reference": "transformers", "weights": weights, "tolerance": TOLERANCE[weights],
              "target": {"relative_error": float(f"{error:.3g}"),
                         "top1_agreement": round(float((got.argmax(-1) == expected.argmax(-1)).float().mean()), 4)}}
    if not error <= TOLERANCE[weights]:
        raise BundleError(f"validation failed: the optimum graph's logits differ from transformers' by {error:.4f} "
                          f"(relative), above the {TOLERANCE[weights]} allowed; nothing was written")
    plain = _greedy(bundled, prompt, speculate=False)
    report["greedy_text_identical"] = plain == generated[len(prompt):]
    if weights == "fp32" and not report["greedy_text_identical"]:
        raise BundleError("validation failed: the fp32 optimum graph's greedy tokens differ from transformers'; "
                          "nothing was written")
    identical = _greedy(bundled, prompt, speculate=True) == plain
    report["speculative_equals_plain"] = {"drafter": "ngram", "identical": identical,
                                          "guaranteed": options.quant.row_invariant}
    if options.quant.row_invariant and not identical:
        raise BundleError("validation failed: n-gram speculation on the optimum graph differs from plain decoding on "
                          "it (the graph is not row-invariant); export with --weights fp32, or run it without a "
                          "drafter")
    config = model.config
    memory = {"target_weights_bytes": model.weight_bytes(), "target_kv_bytes_per_token": kv_per_token(config),
              "max_context": config.max_position_embeddings}
    return {"sequence_tokens": len(generated), "onnx": report}, memory


@contextmanager
def _quiet_loggers(*names: str):
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _greedy(engine, prompt: list[int], *, speculate: bool) -> list[int]:
    engine.reset()
    tokens = []
    for event in engine.generate(prompt, max_new_tokens=VALIDATION_TOKENS, ignore_eos=True, speculate=speculate,
                                 temperature=0.0):
        tokens.extend(event.token_ids)
    return tokens
