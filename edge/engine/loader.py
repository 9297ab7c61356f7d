"""Loading: a LoadSpec in, a ready engine out (what `Engine.load` and `Engine.from_spec` call).

    engine = load_engine(spec, progress, engine_class=Engine)

- a bundle folder (edge-export): its target on one of its backends; drafter "bundle" is the bundle's own.
- a checkpoint folder on backend "onnx": exported once into the cache (the "edge.exporters" entry point), then loaded
  as that bundle.
- a checkpoint folder on torch: config.json is read once and handed on; under a memory budget the planner first fits
  the spec; then the weight files are checked, the tokenizer read, the weights loaded (layers offloaded, `weights`
  quantized or stored in float16), the KV cache allocated and the drafter attached.

`progress(stage, fraction)`, if given, is called as each stage starts (for a loading screen).
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, TypeVar

import torch

from edge.backends.bundle import is_bundle, read_bundle, refuse_unfinished
from edge.errors import BundleError, CheckpointError
from edge.load_spec import LoadSpec
from edge.model.config import ModelConfig
from edge.model.offload import offload_layers
from edge.model.packed_weights import quantize_weights
from edge.model.transformer import Transformer
from edge.planning import fit_to_budget
from edge.sources.loading import check_checkpoint, load_model, not_a_folder, read_config
from edge.sources.sampling_config import recommended_sampling
from edge.text.chat_template import read_template_file
from edge.text.tokenizer import Tokenizer
from edge.memory.device import return_freed_heap

Progress = Callable[[str, float], None]
EngineT = TypeVar("EngineT")


def load_engine(spec: LoadSpec, progress: Progress | None = None, *, engine_class: type[EngineT]) -> EngineT:
    """Load what `spec` names into a new `engine_class`: `engine.spec` is the spec it loaded (after the memory plan,
    when it had a budget). The class comes from the caller (Engine.from_spec passes its own) because engine.py
    imports this module, so this module cannot import it."""
    report = progress or _quiet
    if not spec.path.is_dir():
        raise CheckpointError(not_a_folder(spec.path))
    refuse_unfinished(spec.path)  # an export's work folder, or a bundle without its manifest
    bundled = is_bundle(spec.path)
    spec.check_combination(bundled)
    if bundled:
        return load_bundle(spec, report, engine_class)
    if spec.backend == "onnx":  # a checkpoint on ONNX Runtime: export it once into the cache (int8), then run that
        return load_engine(exported(spec, report), progress, engine_class=engine_class)
    if spec.backend not in (None, "torch"):
        raise CheckpointError(f"backend {spec.backend!r} runs exported bundles; {spec.path} is a checkpoint folder "
                              "(run it on torch or onnx, or export it with edge-export --format torchscript)")
    return load_checkpoint(spec, report, engine_class)


def load_checkpoint(spec: LoadSpec, report: Progress, engine_class: type[EngineT]) -> EngineT:
    """A checkpoint folder on torch, fitted to the spec's memory budget when it has one. Its config.json is read
    once, here, and handed to the planner, the checks, the tokenizer and load_model."""
    config, config_json = read_config(spec.path)
    check_checkpoint(spec.path, config)  # the weights, before the plan and the tokenizer: the first problem shows
    plan = None
    if spec.memory_budget is not None:
        spec, plan = fit_to_budget(spec, config)
    report("reading the tokenizer", 0.0)
    tokenizer = load_tokenizer(spec, config_json)
    report("mapping the weights", 0.1)
    model = target_model(spec, config, report)
    report("allocating the KV cache", 0.7)
    engine = engine_class(model, tokenizer, max_context=spec.max_context, kv_cache=spec.kv_format or "float32")
    engine.spec = spec
    engine.recommended = recommended_sampling(spec.path)
    if spec.drafter is not None:
        report(f"loading the drafter ({spec.drafter})", 0.8)
    engine.use_drafter(spec.drafter, spec.draft_length)
    engine.plan = plan
    return_freed_heap()  # what loading freed stays resident in the C heap otherwise
    report("loaded", 1.0)
    return engine


def target_model(spec: LoadSpec, config: ModelConfig, report: Progress) -> Transformer:
    """The checkpoint's model (`config`: its config) on the spec's device, with its offloaded layers and its weight
    format."""
    if spec.offload_layers:  # split on the host, then move what stays to the device
        model = load_model(spec.path, dtype=spec.dtype, device="cpu", config=config)
        offload_layers(model, list(spec.offload_layers), spec.device)
        model = model.to(spec.device)
        if torch.device(spec.device).type != "cpu":
            model.runner.use(None)  # the batch-invariant kernel is the CPU's
    else:
        model = load_model(spec.path, dtype=spec.dtype, device=spec.device, dequantize=spec.weights == "float16",
                           config=config)
    if spec.weights in ("int8", "int4"):
        report(f"quantizing the weights to {spec.weights}", 0.6)
        quantize_weights(model, spec.weights)
    elif spec.weights == "float16" and model.embed.weight.dtype == torch.float32:
        model.store_weights(torch.float16)
    return model


def load_bundle(spec: LoadSpec, report: Progress, engine_class: type[EngineT]) -> EngineT:
    """An edge-export bundle on one of its backends; drafter "bundle" (or "builtin") is the bundle's own."""
    report("checking the bundle's files", 0.0)
    bundle = read_bundle(spec.path)
    backend = bundle.pick_backend(spec.backend)
    report("reading the tokenizer", 0.3)
    tokenizer = load_tokenizer(spec)
    report(f"opening the target ({backend})", 0.4)
    engine = engine_class(bundle.open_model("target", backend), tokenizer, max_context=spec.max_context)
    engine.bundle, engine.backend, engine.spec = bundle, backend, spec
    engine.recommended = recommended_sampling(spec.path)
    if spec.drafter is not None:
        report(f"opening the drafter ({spec.drafter})", 0.8)
    engine.use_drafter(spec.drafter, spec.draft_length)
    report("loaded", 1.0)
    return engine


def load_tokenizer(spec: LoadSpec, config_json: dict | None = None) -> Tokenizer:
    """The model's tokenizer, with the spec's chat template file in place of its own (`config_json`: the folder's
    config.json object, when it has been read already)."""
    tokenizer = Tokenizer.from_dir(spec.path, config_json)
    if spec.chat_template is not None:
        tokenizer.set_chat_template(read_template_file(spec.chat_template))
    return tokenizer


def exported(spec: LoadSpec, report: Progress) -> LoadSpec:
    """The spec that runs a checkpoint folder on ONNX Runtime: its int8 export in the cache, made once by the
    exporter edge-export registers (the "edge.exporters" entry point: edge/export/auto_export.py). A draft checkpoint
    rides in the export as the bundle's drafter, unless its own weights or cache are asked for: then it runs on
    torch beside the exported target."""
    drafter = spec.drafter
    bake = drafter is not None and drafter.is_draft_checkpoint() and not (spec.draft.weights or spec.draft.kv_cache)
    report("exporting to ONNX (once; cached)", 0.0)
    bundle = exporter("onnx")(spec.path, draft=drafter.folder() if bake else None)
    return spec.replace(path=bundle, drafter=dataclasses.replace(drafter, kind="bundle", argument="") if bake
                        else drafter)


def exporter(name: str) -> Callable[..., Path]:
    """The exporter registered under `name` in the "edge.exporters" entry point; BundleError when none is installed."""
    found = entry_points(group="edge.exporters", name=name)
    try:
        return next(iter(found)).load()
    except (StopIteration, ImportError) as error:
        missing = getattr(error, "name", None) or "edge's exporter"
        raise BundleError(f"running a checkpoint on ONNX Runtime exports it first, which needs {missing}: pip install "
                          "'edge[export]', or export it yourself with edge-export") from None


def _quiet(stage: str, fraction: float) -> None:
    """No loading screen: the stages pass unreported."""
