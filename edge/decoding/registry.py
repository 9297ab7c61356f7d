"""Drafter specs, parsed in one place, and the registry of drafter kinds: what each one is, how it is built, and
what the memory planner counts for it.

    spec = DrafterSpec.parse("hybrid:early-exit:3@vocab.json")
    spec.kind, spec.argument, spec.hybrid, spec.vocabulary   # "early-exit", "3", True, "vocab.json"
    drafter = spec.build(DraftTarget(model, cache, tokenizer, max_len=4096))

The text forms (as the command line takes them):

    KIND[:ARG]           one of the kinds below, with its argument
    PATH                 a draft checkpoint folder (or an edge-export bundle): the same as draft:PATH
    hybrid:SPEC          n-gram lookup when the suffix (2+ tokens) occurred before, else the drafter SPEC
    SPEC@VOCAB.json      a model drafter with its head trimmed to the token ids in VOCAB.json (VocabTrim; make one
                         with `python -m edge.export.vocab_trim`). A draft model whose tokenizer has a vocabulary
                         shipped for it (edge/models/*-vocab) is trimmed to that one unless it says @full

Adding a drafter is one `DrafterKind` entry in `KINDS`.

Where it sits: above the drafters it names (edge/decoding/drafters/, which never import it) and above what it builds
them from: checkpoints and the built-in drafters (edge/sources), bundles (edge/backends), the model (edge/model) and
the tokenizer (edge/text). None of those packages imports anything from edge/decoding, so the registry here, beside
the loop that runs its drafters, adds only one-way edges: decoding -> sources, backends, model, text. The drafters'
package does not re-export it, so importing a drafter loads neither the registry nor the backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from edge.sources.builtin import (builtin_drafter_path, builtin_feature_drafter_path, shipped_datastores,
                                  shipped_feature_drafters, shipped_for, shipped_vocabularies)
from edge.backends.bundle import Bundle, is_bundle, read_bundle
from edge.model.calibration import CALIBRATION_TEXT
from edge.decoding.drafters.base import Drafter
from edge.decoding.drafters.draft_model import DraftModelDrafter
from edge.decoding.drafters.eagle3 import Eagle3Drafter
from edge.decoding.drafters.eagle3_head import head_folder
from edge.decoding.drafters.feature import FeatureDrafter
from edge.decoding.drafters.hybrid import HybridDrafter
from edge.decoding.drafters.layer_skip import AdaptiveLayerSkipDrafter, LayerSkipDrafter
from edge.decoding.drafters.ngram import NGramDrafter
from edge.decoding.drafters.quantspec import BITS, QuantSpecDrafter
from edge.decoding.drafters.retrieval import RetrievalDrafter, read_datastore
from edge.model.trimmed_head import read_vocabulary
from edge.errors import BundleError, SamplingError
from edge.model.kernel_glue import use_kernel
from edge.model.kv_cache import KVCache
from edge.sources.loading import load_model, parse_dtype
from edge.model.transformer import Transformer
from edge.sources.model_source import resolve_model
from edge.model.packed_weights import quantize_weights
from edge.text.tokenizer import Tokenizer

# what the memory planner counts (edge.memory.plan.DRAFTERS): a drafter without weights, one sharing the target's weights
# and cache (self), the target's quantized copy reading its hierarchical cache (quantspec), or a separate model
PLAN_KINDS = ("ngram", "self", "quantspec", "model")


@dataclass(frozen=True)
class DraftTarget:
    """What a drafter is built against: the engine's target, its cache and tokenizer, the draft's cache length, and
    a separate draft model's own options (compute dtype, weight storage, KV cache format)."""

    model: "Transformer | object"  # a Transformer, or an exported model (OnnxModel, TorchStepModel)
    cache: KVCache
    tokenizer: Tokenizer
    max_len: int
    dtype: str = "float32"
    weights: str | None = None  # a draft model's weights: bfloat16, int8 or int4 (None: as loaded)
    kv_cache: str | None = None  # a draft model's own cache format (None: float32)
    bundle: Bundle | None = None  # the bundle the target runs from, if any
    backend: str = "torch"


@dataclass(frozen=True)
class DrafterKind:
    name: str
    usage: str  # the text form, e.g. "ngram[:N]"
    plan: str  # PLAN_KINDS: what the planner counts
    build: Callable[["DrafterSpec", DraftTarget], Drafter]
    argument: str = "none"  # "none", "number", "numbers" (comma-separated), "path"
    argument_required: bool = False
    runs_target_layers: bool = False  # runs part of the target: needs the torch backend
    draft_checkpoint: bool = False  # a separate draft checkpoint run on torch: stored narrower, carried by an export
    values: tuple[int, ...] = ()  # the numbers a "number" argument may be (empty: any)


@dataclass(frozen=True)
class DrafterSpec:
    kind: str
    argument: str = ""
    hybrid: bool = False  # n-gram lookup first, this drafter where there is no match
    vocabulary: str | None = None  # a VocabTrim file: the head's kept token ids

    @classmethod
    def parse(cls, text: "str | DrafterSpec | None") -> "DrafterSpec | None":
        """The spec a text names, or None for no drafter (None, "" or "none"); SamplingError names a bad one."""
        if text is None or isinstance(text, DrafterSpec):
            return text
        if not isinstance(text, str):
            raise SamplingError(f"a drafter spec is text, got {text!r}; expected one of: {usage()}")
        if text in ("", "none"):
            return None
        spec, vocabulary = (text.rpartition("@")[0], text.rpartition("@")[2]) if "@" in text else (text, None)
        hybrid = spec.startswith("hybrid:")
        spec = spec.removeprefix("hybrid:")
        name, _, argument = spec.partition(":")
        if name not in KINDS:
            if not Path(spec).is_dir():
                raise SamplingError(f"unknown drafter {text!r}; expected one of: {usage()}")
            name, argument = "draft", spec  # a bare checkpoint folder
        parsed = cls(name, argument, hybrid, vocabulary or None)
        parsed._check_argument(text)
        return parsed

    def __str__(self) -> str:
        text = f"{self.kind}:{self.argument}" if self.argument else self.kind
        return f"{'hybrid:' if self.hybrid else ''}{text}{'@' + self.vocabulary if self.vocabulary else ''}"

    @property
    def entry(self) -> DrafterKind:
        return KINDS[self.kind]

    @property
    def plan_kind(self) -> str:
        return self.entry.plan

    def numbers(self) -> list[int]:
        return [int(part) for part in self.argument.split(",") if part.strip()]

    def folder(self) -> Path:
        """A model drafter's checkpoint (or bundle) folder."""
        if self.kind == "feature" and not self.argument:
            return _shipped(builtin_feature_drafter_path(), "feature drafter", "feature:PATH")
        if self.kind == "builtin":
            return _shipped(builtin_drafter_path(), "drafter", "draft:PATH to a draft checkpoint")
        if self.kind == "draft":  # a folder, a .gguf file or a Hub id, as the target's model is named
            return resolve_model(self.argument)
        if self.kind == "feature":
            return Path(self.argument)
        if self.kind == "eagle3":  # a folder, or a Hub id from the Hugging Face cache
            return head_folder(self.argument)
        raise SamplingError(f"the {self.kind} drafter has no checkpoint of its own")

    def is_exported(self) -> bool:
        """Whether this is a model drafter read from an edge-export bundle (its weights fixed by the export)."""
        return self.kind == "bundle" or (self.kind == "draft" and is_bundle(self.folder()))

    def is_draft_checkpoint(self) -> bool:
        """Whether this names a separate draft checkpoint (not an export of one): its weights and cache can be stored
        narrower, and an ONNX export of the target can carry it."""
        return self.entry.draft_checkpoint and not self.is_exported()

    def build(self, target: DraftTarget) -> Drafter:
        """The drafter this spec names, against `target`: hybrid-wrapped and head-trimmed as the spec says."""
        if self.entry.runs_target_layers and not isinstance(target.model, Transformer):
            raise SamplingError(f"the {self.kind} drafter runs part of the target's layers, which needs the torch "
                                "backend; with an exported bundle use its drafter ('bundle') or ngram")
        drafter = self.entry.build(self, target)
        vocabulary = self.vocabulary
        if vocabulary is None and self.kind == "draft" and isinstance(getattr(drafter, "model", None), Transformer):
            vocabulary = shipped_vocabulary(target.tokenizer)  # its head cut to the tokens the family's models write
        if vocabulary is not None and vocabulary != FULL_HEAD:
            trim_vocabulary(drafter, vocabulary)
        return HybridDrafter(drafter) if self.hybrid else drafter

    def _check_argument(self, text: str) -> None:
        entry = self.entry
        if self.argument and entry.argument == "none" or entry.argument_required and not self.argument:
            raise SamplingError(f"cannot read the drafter {text!r}: the form is {entry.usage}")
        if entry.argument in ("number", "numbers") and self.argument:
            try:
                numbers = self.numbers()
            except ValueError:
                numbers = []
            if not numbers or entry.argument == "number" and len(numbers) != 1:
                raise SamplingError(f"cannot read the drafter {text!r}: the form is {entry.usage}")
            if entry.values and numbers[0] not in entry.values:
                forms = " or ".join(f"{entry.name}:{value}" for value in entry.values)
                raise SamplingError(f"drafter {text!r}: the number after {entry.name}: is one of "
                                    f"{', '.join(map(str, entry.values))}; use {forms}")


FULL_HEAD = "full"  # SPEC@full: a draft model keeps its whole head even where a vocabulary ships for its tokenizer


def shipped_vocabulary(tokenizer: Tokenizer) -> Path | None:
    """The draft vocabulary shipped for `tokenizer`'s models (edge/models/*-vocab/vocab.json), or None."""
    folder = shipped_for(tokenizer, shipped_vocabularies())
    return folder / "vocab.json" if folder is not None else None


def trim_vocabulary(drafter: Drafter, vocabulary: "str | Path | torch.Tensor") -> None:
    """VocabTrim: the drafter's head keeps only these token ids (a tensor, or a JSON file of them)."""
    if not hasattr(drafter, "trim_vocabulary"):
        raise SamplingError(f"the {drafter.name} drafter has no head to trim; a draft vocabulary applies to draft "
                            "models, layer-skip and feature drafters")
    drafter.trim_vocabulary(vocabulary if isinstance(vocabulary, torch.Tensor) else read_vocabulary(vocabulary))


def _shipped(path: Path | None, what: str, instead: str) -> Path:
    if path is None:
        raise SamplingError(f"this installation ships no built-in {what}; pass {instead}")
    return path


def load_draft_model(path: Path, target: Transformer, tokenizer: Tokenizer, *, max_len: int,
                     dtype: str = "float32", weights: str | None = None,
                     kv_cache: str | None = None) -> DraftModelDrafter:
    """A draft checkpoint computing in `dtype`; `weights="bfloat16"` stores its matrices in bfloat16 (half the
    memory) and `weights="int8"` / `"int4"` quantizes its layers (edge/model/packed_weights.py: a quarter or an eighth
    of float32, and faster drafting); the target still verifies in its own precision, so output is unchanged."""
    draft_tokenizer = Tokenizer.from_dir(path)
    draft = load_model(path, dtype=dtype, device=target.device)
    DraftModelDrafter.check_compatible(target, tokenizer, draft, draft_tokenizer)
    if weights in ("int8", "int4"):
        quantize_weights(draft, weights)
    elif weights is not None and parse_dtype(weights) != draft.dtype:
        draft.store_weights(parse_dtype(weights))
    if not isinstance(target, Transformer) and draft.runner.matmul is not None:
        # beside an exported target (onnxruntime's own spinning threads) the drafter's kernel runs on one thread:
        # measured 4x faster drafting than two threads contending on a 2-core CPU
        # (docs/history/benchmarks-2026-11-21.md)
        use_kernel(draft, draft.runner.matmul.with_threads(1))
    return DraftModelDrafter(draft, max_len, kv_cache)


def bundle_drafter(path: "str | Path | Bundle", tokenizer: Tokenizer, max_len: int,
                   backend: str = "onnx") -> DraftModelDrafter:
    """The drafter a bundle (a folder, or one already read) carries, on `backend`; its tokenizer must be
    `tokenizer`'s."""
    bundle = path if isinstance(path, Bundle) else read_bundle(path)
    if not bundle.has_drafter:
        raise BundleError(f"the bundle {bundle.root} holds no drafter; draft from the prompt with --drafter ngram, "
                          "or export the bundle again with --drafter DRAFT (a smaller checkpoint with the same "
                          "tokenizer)")
    if bundle.manifest["drafter"]["tokenizer_sha256"] != tokenizer.fingerprint()["vocab_sha256"]:
        raise BundleError(f"the drafter in {bundle.root} was exported with a different tokenizer than the target's; "
                          "a drafter must share the target's tokenizer")
    if backend not in bundle.backends("drafter"):
        backend = bundle.backends("drafter")[0]
    # one thread: the draft graph is small, and a second runtime's spinning workers would slow the target's
    return DraftModelDrafter(bundle.open_model("drafter", backend, threads=1), max_len)


def _draft_model(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    if spec.kind == "builtin" and target.bundle is not None:
        return _bundle(spec, target)  # a bundle's "builtin" drafter is its own
    folder = spec.folder()
    if is_bundle(folder):  # an edge-export bundle's drafter graph on the ONNX backend
        return bundle_drafter(folder, target.tokenizer, target.max_len)
    return load_draft_model(folder, target.model, target.tokenizer, max_len=target.max_len, dtype=target.dtype,
                            weights=target.weights, kv_cache=target.kv_cache)


def _bundle(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    if target.bundle is None:
        raise SamplingError("drafter 'bundle' is the drafter of an exported bundle; load a bundle folder")
    return bundle_drafter(target.bundle, target.tokenizer, target.max_len, target.backend)


def _retrieval(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    folder = Path(spec.argument) if spec.argument else shipped_for(target.tokenizer, shipped_datastores())
    if folder is None:
        raise SamplingError("no retrieval datastore ships for this model's tokenizer; write one from its replies "
                            "(python -m train.replies, then python -m train.datastore) and pass retrieval:FOLDER")
    return RetrievalDrafter(read_datastore(folder, target.tokenizer))


def _feature(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    """feature:PATH, or the one packed for this model's tokenizer (edge/models/*-feature), else the built-in one."""
    folder = spec.folder() if spec.argument else shipped_for(target.tokenizer, shipped_feature_drafters())
    return FeatureDrafter.load(folder or spec.folder(), target.model, target.max_len)


def _eagle3(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    """eagle3:PATH_OR_HUB_ID, a published EAGLE-3 head for this target."""
    return Eagle3Drafter.load(spec.argument, target.model, target.max_len)


def _early_exit(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    exit_layer = spec.numbers()[0] if spec.argument else max(1, target.model.config.num_layers // 3)
    return LayerSkipDrafter.early_exit(target.model, target.cache, exit_layer)


KINDS: dict[str, DrafterKind] = {kind.name: kind for kind in (
    DrafterKind("ngram", "ngram[:N]", "ngram", argument="number",
                build=lambda spec, target: NGramDrafter(max_ngram=spec.numbers()[0] if spec.argument else 4)),
    # REST: what the target itself wrote after the same tokens (a datastore of its replies), and prompt lookup
    DrafterKind("retrieval", "retrieval[:FOLDER]", "ngram", argument="path", build=_retrieval),
    DrafterKind("early-exit", "early-exit[:E]", "self", argument="number", runs_target_layers=True,
                build=_early_exit),
    # no layers listed: LayerSkipDrafter.skipping says the draft would cost as much as the target
    DrafterKind("skip", "skip:L1,L2,...", "self", argument="numbers", runs_target_layers=True,
                build=lambda spec, target: LayerSkipDrafter.skipping(target.model, target.cache, spec.numbers())),
    DrafterKind("adaptive", "adaptive", "self", runs_target_layers=True,
                build=lambda spec, target: AdaptiveLayerSkipDrafter(
                    target.model, target.cache, calibration_ids=target.tokenizer.encode(CALIBRATION_TEXT))),
    DrafterKind("quantspec", "quantspec[:B]", "quantspec", argument="number", runs_target_layers=True, values=BITS,
                build=lambda spec, target: QuantSpecDrafter(target.model, target.cache,
                                                            bits=spec.numbers()[0] if spec.argument else 4)),
    DrafterKind("draft", "draft:PATH", "model", argument="path", argument_required=True, draft_checkpoint=True,
                build=_draft_model),
    DrafterKind("builtin", "builtin", "model", draft_checkpoint=True, build=_draft_model),
    # a feature drafter: its layers and their cache, counted like a draft model; it has no narrower forms
    DrafterKind("feature", "feature[:PATH]", "model", argument="path",
                build=_feature),
    # an EAGLE-3 head (Hub layout, LlamaForCausalLMEagle3) over the target's low, middle and high layers' streams
    DrafterKind("eagle3", "eagle3:PATH", "model", argument="path", argument_required=True, runs_target_layers=True,
                build=_eagle3),
    DrafterKind("bundle", "bundle", "model", build=_bundle),
)}


def usage() -> str:
    """Every drafter's text form, for help and error messages."""
    return ", ".join(kind.usage for kind in KINDS.values()) + ", PATH, hybrid:SPEC (+ @VOCAB.json)"
