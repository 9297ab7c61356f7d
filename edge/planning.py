"""From a checkpoint and the options a user gave to a memory plan, without loading any weights."""

from __future__ import annotations

from pathlib import Path

from edge.config import ModelConfig
from edge.drafters import DRAFTER_SPECS
from edge.errors import SamplingError
from edge.speculative import DraftLength
from memory.device import probe
from memory.plan import Plan, PlanRequest, make_plan

PLAN_DRAFTERS = {"ngram": "ngram", "early-exit": "self", "skip": "self", "adaptive": "self", "quantspec": "quantspec",
                 "builtin": "model", "feature": "model",  # a feature drafter: one layer and its cache, counted alike
                 "draft": "model"}


def drafter_kind(spec: str | None) -> str:
    """What the planner counts for a drafter spec: none, ngram, self (shares the target's memory) or model."""
    if not spec or spec == "none":
        return "none"
    spec = without_vocabulary(spec).removeprefix("hybrid:")
    name = spec.partition(":")[0]
    if name in PLAN_DRAFTERS:
        return PLAN_DRAFTERS[name]
    if Path(spec).is_dir():
        return "model"
    raise SamplingError(f"unknown drafter {spec!r}; expected one of: {DRAFTER_SPECS}")


def without_vocabulary(spec: str) -> str:
    """The drafter spec without its VocabTrim suffix ("early-exit:3@vocab.json" -> "early-exit:3")."""
    return spec.rpartition("@")[0] if "@" in spec else spec


def drafter_folder(spec: str) -> Path:
    name, _, arg = without_vocabulary(spec).removeprefix("hybrid:").partition(":")
    if name == "feature" and not arg:
        from edge.builtin import builtin_feature_drafter_path

        path = builtin_feature_drafter_path()
        if path is None:
            raise SamplingError("this installation ships no built-in feature drafter; pass feature:PATH")
        return path
    if name == "builtin":
        from edge.builtin import builtin_drafter_path

        path = builtin_drafter_path()
        if path is None:
            raise SamplingError("this installation ships no built-in drafter; pass draft:PATH to a draft checkpoint")
        return path
    return Path(arg if name in ("draft", "feature") else spec)


def plan_for(model: str | Path, *, budget: str | int | None, device: str = "cpu", dtype: str = "float32",
             max_context: int, drafter: str | None = None, draft_length: int | str = "adaptive",
             draft_context: int | None = None, draft_weights: str | None = None,
             draft_kv: str | None = None, kv_cache: str | None = None) -> Plan:
    """The plan for serving `model` with `drafter` in the budget (None: what the device has free)."""
    config = ModelConfig.from_dir(model)
    weight_dtype = kept_weight_dtype(model, dtype, device)  # what load_model will store the weights in
    kind = drafter_kind(drafter)
    kv_dtype = kv_cache or ("hierarchical" if kind == "quantspec" else str(dtype))  # what the engine allocates
    spec = without_vocabulary(drafter or "").removeprefix("hybrid:")
    bits = int(spec.partition(":")[2] or 4) if kind == "quantspec" else 4
    # an exported drafter's weights and cache are fixed by its export; a feature drafter has no narrower forms
    torch_drafter = not is_bundle_spec(drafter) and spec.partition(":")[0] != "feature"
    drafter_shape, drafter_dtype = (drafter_description(drafter, draft_weights, str(dtype), device) if kind == "model"
                                    else (None, None))
    longest = DraftLength.parse(draft_length).longest
    context = min(max_context, config.max_position_embeddings)
    request = PlanRequest(target=config.shape(), context=context, drafter=kind, drafter_shape=drafter_shape,
                          draft_length=longest, weight_dtype=weight_dtype, kv_dtype=kv_dtype, quantspec_bits=bits,
                          min_context=min(256, context), draft_context=draft_context,
                          min_draft_context=max(2 * (longest + 1), min(256, context)),
                          drafter_weight_dtype=drafter_dtype, narrow_drafter=drafter_dtype == str(dtype) == "float32"
                          and torch_drafter, draft_kv_dtype=draft_kv,
                          quantizable_draft_kv=kind == "model" and draft_kv is None and torch_drafter,
                          can_offload=device.startswith("cuda"))
    plan = make_plan(request, probe(device, budget).budget)
    plan.runtime_overhead = runtime_overhead(device)
    return plan


def runtime_overhead(device: str) -> int:
    """The runtime's own memory as the planner runs (imports done, no weights yet): the process's resident memory
    on a CPU, the CUDA context and allocator reserve on a GPU."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.memory_reserved(torch.device(device))
    import psutil

    return psutil.Process().memory_info().rss


BUNDLE_WEIGHT_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8", "int4": "int4"}


def kept_weight_dtype(folder: str | Path, dtype: str, device: str) -> str:
    """The dtype load_model keeps a checkpoint's weights in when computing in `dtype` (edge.loading.storage_dtype:
    a 16-bit checkpoint computed in float32 on the CPU stays 16-bit)."""
    import torch

    from edge.loading import checkpoint_dtype, parse_dtype, storage_dtype

    kept = storage_dtype(checkpoint_dtype(folder), parse_dtype(dtype), torch.device(device))
    return str(kept).removeprefix("torch.")


def drafter_description(spec: str, weights: str | None, dtype: str = "float32", device: str = "cpu"):
    """The shape and weight dtype of a draft model: a checkpoint folder is stored in `weights` when given, else as
    load_model keeps it computing in `dtype`; an edge-export bundle's drafter keeps the weight format it was
    exported with."""
    from edge.bundle import is_bundle, read_bundle

    folder = drafter_folder(spec)
    if is_bundle(folder):
        bundle = read_bundle(folder, verify=False)
        if not bundle.has_drafter:
            raise SamplingError(f"the bundle {folder} holds no drafter; export it with --drafter, or use ngram")
        return bundle.config("drafter").shape(), BUNDLE_WEIGHT_DTYPES[bundle.manifest["quantization"]["weights"]]
    return ModelConfig.from_dir(folder).shape(), weights or kept_weight_dtype(folder, dtype, device)


def is_bundle_spec(spec: str | None) -> bool:
    from edge.bundle import is_bundle

    return drafter_kind(spec) == "model" and is_bundle(drafter_folder(spec))


def planned_drafter(requested: str | None, plan: Plan) -> str | None:
    """The drafter spec to load under `plan`: the requested one, or what the plan stepped down to."""
    if plan.drafter == "none":
        return None
    return requested if drafter_kind(requested) == plan.drafter else plan.drafter
