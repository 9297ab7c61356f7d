"""From a load spec to a memory plan, without loading any weights; and from a plan back to the spec to load.

    plan = planning.plan(spec)                     # what edge-chat --plan prints
    spec, plan = planning.fit_to_budget(spec)      # what Engine.from_spec loads under spec.memory_budget
"""

from __future__ import annotations

from pathlib import Path

import psutil
import torch

from edge.backends.bundle import is_bundle, read_bundle
from edge.model.config import ModelConfig
from edge.decoding.drafters.eagle3_head import Eagle3Config
from edge.decoding.registry import DrafterSpec
from edge.errors import MemoryBudgetError, SamplingError
from edge.sources.gguf_checkpoint import gguf_index
from edge.sources.gguf_weights import runs_as_blocks, stored_bytes
from edge.load_spec import DraftModelOptions, LoadSpec
from edge.sources.loading import checkpoint_dtype, parse_dtype, storage_dtype
from edge.decoding.speculative import DraftLength
from edge.memory.budget import BudgetError
from edge.memory.device import probe
from edge.memory.plan import Plan, PlanRequest, make_plan

BUNDLE_WEIGHT_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8", "int4": "int4"}


def plan(spec: LoadSpec, config: ModelConfig | None = None, slots: int | None = 1, prompt_cache: int = 0) -> Plan:
    """The plan for loading `spec` in its memory budget (None: what the device has free); `config` is the
    checkpoint's, when it has been read already; `slots` replies decoded together (edge-serve --parallel; None: as
    many as fit, edge/memory/plan.py) with a prompt cache of `prompt_cache` bytes. A budget that cannot be read or
    cannot hold the model is a MemoryBudgetError."""
    config = config if config is not None else ModelConfig.from_dir(spec.path)
    drafter = spec.drafter
    kind = drafter.plan_kind if drafter is not None else "none"
    bits = int(drafter.argument or 4) if kind == "quantspec" else 4
    # an exported drafter's weights and cache are fixed by its export; a feature drafter has no narrower forms
    narrowable = drafter is not None and drafter.is_draft_checkpoint()
    drafter_shape, drafter_dtype = drafter_description(drafter, spec) if kind == "model" else (None, None)
    longest = DraftLength.parse(spec.draft_length).longest
    context = min(spec.max_context, config.max_position_embeddings)
    weight_dtype, stored = target_weights(spec, config)
    request = PlanRequest(target=config.shape(), context=context, drafter=kind, drafter_shape=drafter_shape,
                          draft_length=longest, weight_dtype=weight_dtype, stored_weight_bytes=stored,
                          kv_dtype=spec.kv_format or spec.dtype, quantspec_bits=bits, min_context=min(256, context),
                          draft_context=spec.draft.context,
                          min_draft_context=max(2 * (longest + 1), min(256, context)),
                          drafter_weight_dtype=drafter_dtype,
                          narrow_drafter=narrowable and drafter_dtype == spec.dtype == "float32",
                          draft_kv_dtype=spec.draft.kv_cache,
                          quantizable_draft_kv=narrowable and spec.draft.kv_cache is None,
                          can_offload=spec.device.startswith("cuda"), slots=slots, prompt_cache=prompt_cache)
    try:
        result = make_plan(request, probe(spec.device, spec.memory_budget).budget)
    except BudgetError as error:  # an unreadable size, no CUDA GPU, or a budget too small: the user's to fix
        raise MemoryBudgetError(str(error)) from None
    result.runtime_overhead = runtime_overhead(spec.device)
    return result


def fit_to_budget(spec: LoadSpec, config: ModelConfig | None = None) -> tuple[LoadSpec, Plan]:
    """The spec to load under `spec.memory_budget` (context, drafter, the draft model's options and offloaded layers
    as the plan chose them), and the plan; `config` as for plan()."""
    chosen = plan(spec, config)
    draft = DraftModelOptions(chosen.draft_context or spec.draft.context,
                              chosen.drafter_weights or spec.draft.weights, chosen.draft_kv or spec.draft.kv_cache)
    fitted = spec.replace(max_context=chosen.max_context, drafter=planned_drafter(spec.drafter, chosen), draft=draft,
                          offload_layers=tuple(chosen.offloaded_layers) or spec.offload_layers)
    return fitted, chosen


def plan_for(model: str | Path, *, budget: str | int | None, **options) -> Plan:
    """The plan for `model` loaded with Engine.load's keyword `options` in `budget` (None: the free memory)."""
    return plan(LoadSpec.from_options(model, memory_budget=budget, **options))


def runtime_overhead(device: str) -> int:
    """The runtime's own memory as the planner runs (imports done, no weights yet): the process's resident memory
    on a CPU, the CUDA context and allocator reserve on a GPU."""
    if device.startswith("cuda"):
        return torch.cuda.memory_reserved(torch.device(device))
    return psutil.Process().memory_info().rss


def target_weights(spec: LoadSpec, config: ModelConfig | None = None) -> tuple[str, int | None]:
    """How the target's weights are held, and their bytes where the shape cannot size them: a quantized GGUF file
    on the CPU keeps its blocks (its file type, their exact size); --weights int8/int4/float16 load that; anything
    else the dtype load_model keeps (`config`: the checkpoint's, when it has been read already)."""
    index = gguf_index(spec.path)
    if (index is not None and spec.weights is None and runs_as_blocks(index) and spec.device == "cpu"
            and spec.dtype == "float32"):
        return index["file_type"], stored_bytes(index)
    if spec.weights is not None:
        return spec.weights, None
    return kept_weight_dtype(spec.path, spec.dtype, spec.device, config), None


def kept_weight_dtype(folder: str | Path, dtype: str, device: str, config: ModelConfig | None = None) -> str:
    """The dtype load_model keeps a checkpoint's weights in when computing in `dtype`
    (edge.sources.loading.storage_dtype: a 16-bit checkpoint computed in float32 on the CPU stays 16-bit);
    `config` as for checkpoint_dtype."""
    kept = storage_dtype(checkpoint_dtype(folder, config), parse_dtype(dtype), torch.device(device))
    return str(kept).removeprefix("torch.")


def drafter_description(drafter: DrafterSpec, spec: LoadSpec):
    """The shape and weight dtype of a draft model: a checkpoint folder is stored in the draft weights asked for,
    else as load_model keeps it computing in the spec's dtype; an edge-export bundle's drafter keeps the weight
    format it was exported with."""
    if drafter.kind == "bundle":
        raise SamplingError("drafter 'bundle' is the drafter of an exported bundle; plan its source checkpoint")
    folder = drafter.folder()
    if drafter.kind == "eagle3":  # an EAGLE-3 head: its one layer and draft-vocabulary head, in the target's dtype
        return Eagle3Config.read(folder).shape(), spec.dtype
    if is_bundle(folder):
        bundle = read_bundle(folder, verify=False)
        if not bundle.has_drafter:
            raise SamplingError(f"the bundle {folder} holds no drafter; draft from the prompt with --drafter ngram, "
                                "or export the bundle again with --drafter DRAFT (a smaller checkpoint with the same "
                                "tokenizer)")
        return bundle.config("drafter").shape(), BUNDLE_WEIGHT_DTYPES[bundle.manifest["quantization"]["weights"]]
    return (ModelConfig.from_dir(folder).shape(),
            spec.draft.weights or kept_weight_dtype(folder, spec.dtype, spec.device))


def planned_drafter(requested: DrafterSpec | None, chosen: Plan) -> DrafterSpec | None:
    """The drafter to load under a plan: the requested one, or what the plan stepped down to."""
    if chosen.drafter == "none":
        return None
    if requested is not None and requested.plan_kind == chosen.drafter:
        return requested
    return DrafterSpec.parse(chosen.drafter)
