"""The load spec: everything loading a model needs, in one checked, frozen object.

    spec = LoadSpec.from_options("path/to/checkpoint", weights="int8", drafter="hybrid:feature", kv_cache="int8")
    engine = Engine.from_spec(spec)          # Engine.load(path, **options) is the same, spelled as keywords
    plan = planning.plan(spec)               # what it costs, from config files only (edge-chat --plan)

The command line (edge.frontend.options.load_spec), the chat app's settings (edge.tui.settings.ChatSettings.applied_to), the
memory planner (edge.planning.fit_to_budget: a spec in, the adjusted spec out) and Engine.from_spec all read and
write this one object, so an option cannot reach one of them and miss another. Values are checked when the spec is
made; each bad one raises an EdgeError that names it and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edge.decoding.registry import DrafterSpec
from edge.errors import BundleError, CheckpointError, PromptError, SamplingError
from edge.sources.loading import parse_dtype
from edge.sources.model_source import resolve_model
from edge.model.packed_weights import FORMATS as WEIGHT_QUANTIZATIONS
from edge.model.quantized_kv_cache import KV_CACHE_CHOICES
from edge.decoding.speculative import DraftLength

DEFAULT_MAX_CONTEXT = 4096
DTYPES = ("float32", "bfloat16", "float16")
BACKENDS = ("torch", "onnx", "torchscript", "torch-export")
DRAFT_WEIGHTS = ("float32", "bfloat16", *WEIGHT_QUANTIZATIONS)
# --weights: re-quantize for edge's kernel (int8, int4), or 16-bit matrices computed in float32 (float16: a GGUF
# file's blocks dequantized, a float32 checkpoint narrowed); None: as stored (a GGUF file in its own quantization)
LOAD_WEIGHTS = (*WEIGHT_QUANTIZATIONS, "float16")
DRAFT_KV_CACHES = ("float32", "int8", "int8-int4")


def kv_cache_for(drafter: "DrafterSpec | str | None", kv_cache: str | None) -> str | None:
    """The KV cache format an engine with `drafter` allocates: `kv_cache` where given, hierarchical for QuantSpec (what
    its draft reads), else None (the compute dtype)."""
    spec = DrafterSpec.parse(drafter)
    if kv_cache is None and spec is not None and spec.kind == "quantspec":
        return "hierarchical"
    return kv_cache


@dataclass(frozen=True)
class DraftModelOptions:
    """A separate draft model's own options (other drafters ignore them)."""

    context: int | None = None  # its cache length: it drafts from a window of the newest tokens (None: the context)
    weights: str | None = None  # DRAFT_WEIGHTS: stored narrower than the compute dtype, or quantized
    kv_cache: str | None = None  # DRAFT_KV_CACHES: its own cache quantized

    def __post_init__(self) -> None:
        if self.weights not in (None, *DRAFT_WEIGHTS):
            raise SamplingError(f"draft weights {self.weights!r}: choose one of {', '.join(DRAFT_WEIGHTS)}")
        if self.kv_cache not in (None, *DRAFT_KV_CACHES):
            raise SamplingError(f"draft KV cache {self.kv_cache!r}: choose one of {', '.join(DRAFT_KV_CACHES)}")
        if self.context is not None and (not isinstance(self.context, int) or isinstance(self.context, bool)):
            raise SamplingError(f"draft context must be a whole number of tokens, got {self.context!r}")


@dataclass(frozen=True)
class LoadSpec:
    path: Path  # a checkpoint folder or an edge-export bundle (from_options resolves .gguf files and Hub ids)
    dtype: str = "float32"  # what the model computes in
    device: str = "cpu"
    weights: str | None = None  # LOAD_WEIGHTS: int8 / int4 re-quantize the layers at load, float16 keeps 16-bit
    #                             matrices (None: as stored)
    max_context: int = DEFAULT_MAX_CONTEXT
    backend: str | None = None  # BACKENDS (None: torch for a folder, the bundle's first for a bundle)
    kv_cache: str | None = None  # KV_CACHE_CHOICES (None: the compute dtype, or hierarchical for quantspec)
    offload_layers: tuple[int, ...] = ()  # layers kept in host memory, streamed in as they run
    memory_budget: str | int | None = None  # plan for this budget ("6GiB" or bytes); None: allocate as asked
    drafter: DrafterSpec | None = None  # None: plain decoding
    draft_length: str = "adaptive"  # "adaptive", "adaptive:P" or a whole number
    draft: DraftModelOptions = field(default_factory=DraftModelOptions)
    chat_template: Path | None = None  # a Jinja file replacing the model's chat template (or giving a base model one)

    def __post_init__(self) -> None:
        set_field = object.__setattr__  # normalizing a frozen dataclass's fields as it is made
        set_field(self, "path", Path(self.path))
        set_field(self, "dtype", str(parse_dtype(self.dtype)).removeprefix("torch."))
        set_field(self, "drafter", DrafterSpec.parse(self.drafter))
        set_field(self, "draft_length", str(self.draft_length))
        set_field(self, "offload_layers", tuple(self.offload_layers or ()))
        if self.chat_template is not None:
            set_field(self, "chat_template", Path(self.chat_template))
        DraftLength.parse(self.draft_length)  # raises naming the accepted forms
        if not isinstance(self.max_context, int) or isinstance(self.max_context, bool) or self.max_context < 2:
            raise PromptError(f"max_context must be an integer >= 2, got {self.max_context!r}")
        if self.weights not in (None, *LOAD_WEIGHTS):
            raise CheckpointError(f"weights {self.weights!r}: choose one of {', '.join(LOAD_WEIGHTS)} (leave it out "
                                  "to use the checkpoint's weights as stored)")
        if self.backend not in (None, *BACKENDS):
            raise CheckpointError(f"backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.kv_cache not in (None, *KV_CACHE_CHOICES):
            raise SamplingError(f"KV cache {self.kv_cache!r}: choose one of {', '.join(KV_CACHE_CHOICES)}")

    @classmethod
    def from_options(cls, path: str | Path, *, draft_context: int | None = None, draft_weights: str | None = None,
                     draft_kv: str | None = None, draft_vocab: str | Path | None = None,
                     dtype: str | torch.dtype = "float32", draft_length: int | str = "adaptive",
                     offload_layers: "list[int] | tuple[int, ...] | None" = None,
                     drafter: "str | DrafterSpec | None" = None, **options) -> "LoadSpec":
        """A spec from Engine.load's keywords: the draft model's options flat (draft_context, draft_weights,
        draft_kv), and draft_vocab as the drafter's VocabTrim file. `path` may also be a .gguf file or a Hub id
        (org/name), resolved to a checkpoint folder here (edge/sources/model_source.py)."""
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)} - {"draft"})
        if unknown:
            raise TypeError(f"unknown load option {unknown[0]!r}")
        spec = DrafterSpec.parse(drafter)
        if draft_vocab is not None:
            if spec is None:
                raise SamplingError("a draft vocabulary trims a drafter's head; pass a drafter too")
            spec = dataclasses.replace(spec, vocabulary=str(draft_vocab))
        return cls(resolve_model(path), dtype=dtype, draft_length=draft_length,
                   offload_layers=tuple(offload_layers or ()), drafter=spec,
                   draft=DraftModelOptions(draft_context, draft_weights, draft_kv), **options)

    def replace(self, **changes) -> "LoadSpec":
        return dataclasses.replace(self, **changes)

    @property
    def kv_format(self) -> str | None:
        """The KV cache format the engine allocates: the one asked for, hierarchical for QuantSpec (what its draft
        reads), else None (the compute dtype)."""
        return kv_cache_for(self.drafter, self.kv_cache)

    def check_combination(self, is_bundle: bool) -> None:
        """Raise for options that cannot go together on this path (a bundle folder or a checkpoint folder)."""
        backend = self.backend or ("onnx" if is_bundle else "torch")
        if self.weights and (is_bundle or backend != "torch" or self.offload_layers):
            raise CheckpointError(f"--weights {self.weights} quantizes a checkpoint folder for the torch backend on "
                                  "the CPU; a bundle or another backend brings its own quantization, and offloaded "
                                  "layers stay as stored (leave out --weights)")
        if self.memory_budget is not None and is_bundle:
            raise BundleError("--memory-budget plans checkpoint folders; a bundle's memory needs are in its "
                              "manifest.json (load the source checkpoint folder to plan against a budget)")
        if self.memory_budget is not None and backend != "torch":
            raise CheckpointError(f"--memory-budget plans a checkpoint on the torch backend; --backend {backend} runs "
                                  "the export as it was made (leave out one of them)")
        if self.kv_format not in (None, "float32", self.dtype) and backend != "torch":
            raise CheckpointError(f"a quantized KV cache ({self.kv_format}) runs on the torch backend; leave out "
                                  f"--kv-cache{' and quantspec' if self.kv_cache is None else ''} with --backend "
                                  f"{backend}, or load the checkpoint folder on torch")
        if self.offload_layers and is_bundle:
            raise BundleError("offloaded layers apply to a checkpoint folder on the torch backend, not a bundle")
        exported_drafter = self.drafter is not None and (self.drafter.is_exported()
                                                         or is_bundle and self.drafter.kind == "builtin")
        if exported_drafter and (self.draft.weights or self.draft.kv_cache):
            raise SamplingError("an exported drafter keeps the weights and cache it was exported with; leave out "
                                "--draft-weights and --draft-kv, or pass its source checkpoint as draft:PATH")
