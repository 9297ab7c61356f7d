"""Drafters: token-guess sources for speculative decoding, all behind the `Drafter` interface (base.py).

`make_drafter(spec, ...)` builds one from a short description, as the command line takes it:

    ngram[:N]            prompt lookup with n-grams of up to N tokens (default 4); no weights
    early-exit[:E]       the target's first E layers and its head (default: a third of the layers)
    skip:L1,L2,...       the target without the listed layers
    adaptive             picks among early exits and a skip set at run time from measured speed
    draft:PATH | PATH    a separate small checkpoint with the same tokenizer (or an edge-export bundle's drafter)
    builtin              the built-in drafter shipped with the built-in model
    feature[:PATH]       a feature drafter (EAGLE-style: one layer over the target's hidden states) trained for
                         this target (default: the built-in model's)
    quantspec[:B]        the target with B-bit weights (4 or 8; default 4) reading the upper 4 bits of its
                         hierarchical KV cache (QuantSpec; needs kv_cache="hierarchical")
    hybrid:SPEC          n-gram lookup when the suffix (2+ tokens) occurred before, else the drafter SPEC
                         (handled by Engine.use_drafter)
    SPEC@VOCAB.json      any model drafter above with its head trimmed to the token ids in VOCAB.json (VocabTrim;
                         make one with `python -m export.vocab_trim`) (handled by Engine.use_drafter)
"""

from __future__ import annotations

from pathlib import Path

from edge.bundle import bundle_drafter, is_bundle
from edge.drafters.base import Draft, Drafter, DraftSampler
from edge.drafters.draft_model import DraftModelDrafter
from edge.drafters.layer_skip import AdaptiveLayerSkipDrafter, LayerSkipDrafter
from edge.drafters.ngram import NGramDrafter
from edge.errors import SamplingError
from edge.kv_cache import KVCache
from edge.model import Transformer
from edge.tokenizer import Tokenizer

__all__ = ["Draft", "Drafter", "DraftSampler", "DraftModelDrafter", "LayerSkipDrafter", "AdaptiveLayerSkipDrafter",
           "NGramDrafter", "make_drafter", "DRAFTER_SPECS"]
DRAFTER_SPECS = ("ngram[:N], early-exit[:E], skip:L1,L2,..., adaptive, quantspec[:B], draft:PATH, builtin, "
                 "feature[:PATH], hybrid:SPEC (+ @VOCAB.json)")


def make_drafter(spec: str, model: Transformer, cache: KVCache, tokenizer: Tokenizer, *, max_len: int,
                 dtype: str = "float32", weights: str | None = None, kv_cache: str | None = None) -> Drafter:
    name, _, arg = spec.partition(":")
    if name in ("early-exit", "skip", "adaptive", "quantspec") and not isinstance(model, Transformer):
        raise SamplingError(f"the {name} drafter runs part of the target's layers, which needs the torch backend; "
                            "with an exported bundle use its drafter ('bundle') or ngram")
    if name == "quantspec":
        from edge.drafters.quantspec import QuantSpecDrafter

        return QuantSpecDrafter(model, cache, bits=_integers(spec, arg)[0] if arg else 4)
    if name == "ngram":
        return NGramDrafter(max_ngram=_integers(spec, arg)[0] if arg else 4)
    if name == "early-exit":
        exit_layer = _integers(spec, arg)[0] if arg else max(1, model.config.num_layers // 3)
        return LayerSkipDrafter.early_exit(model, cache, exit_layer)
    if name == "skip":
        return LayerSkipDrafter.skipping(model, cache, _integers(spec, arg))
    if name == "adaptive":
        return AdaptiveLayerSkipDrafter(model, cache)
    if name == "feature":
        from edge.builtin import builtin_feature_drafter_path
        from edge.drafters.feature import FeatureDrafter

        path = Path(arg) if arg else builtin_feature_drafter_path()
        if path is None:
            raise SamplingError("this installation ships no built-in feature drafter; pass feature:PATH")
        return FeatureDrafter.load(path, model, max_len)
    if name == "builtin":
        from edge.builtin import builtin_drafter_path

        path = builtin_drafter_path()
        if path is None:
            raise SamplingError("this installation ships no built-in drafter; pass draft:PATH to a draft checkpoint")
        return load_draft_model(path, model, tokenizer, max_len=max_len, dtype=dtype, weights=weights,
                                kv_cache=kv_cache)
    if name == "draft" or Path(spec).is_dir():
        path = Path(arg if name == "draft" else spec)
        if is_bundle(path):  # an edge-export bundle: its drafter graph on the ONNX backend
            return bundle_drafter(path, tokenizer, max_len)
        return load_draft_model(path, model, tokenizer, max_len=max_len, dtype=dtype, weights=weights,
                                kv_cache=kv_cache)
    raise SamplingError(f"unknown drafter {spec!r}; expected one of: {DRAFTER_SPECS}")


def _integers(spec: str, text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SamplingError(f"cannot read the drafter {spec!r}; expected one of: {DRAFTER_SPECS}") from None


def load_draft_model(path: Path, target: Transformer, tokenizer: Tokenizer, *, max_len: int,
                     dtype: str = "float32", weights: str | None = None,
                     kv_cache: str | None = None) -> DraftModelDrafter:
    """A draft checkpoint computing in `dtype`; `weights="bfloat16"` stores its matrices in bfloat16 (half the
    memory) and `weights="int8"` / `"int4"` quantizes its layers (edge/packed_weights.py: a quarter or an eighth of
    float32, and faster drafting);
    the target still verifies in its own precision, so output is unchanged."""
    from edge.loading import load_model, parse_dtype

    draft_tokenizer = Tokenizer.from_dir(path)
    draft = load_model(path, dtype=dtype, device=target.device)
    DraftModelDrafter.check_compatible(target, tokenizer, draft, draft_tokenizer)
    if weights in ("int8", "int4"):
        from edge.packed_weights import quantize_weights

        quantize_weights(draft, weights)
    elif weights is not None and parse_dtype(weights) != draft.dtype:
        draft.store_weights(parse_dtype(weights))
    if not isinstance(target, Transformer) and draft.rowwise is not None:
        # beside an exported target (onnxruntime's own spinning threads) the drafter's kernel runs on one thread:
        # measured 4x faster drafting than two threads contending on a 2-core CPU
        # (docs/history/benchmarks-2026-11-21.md)
        draft.use_rowwise_matmul(draft.rowwise.with_threads(1), draft.rowwise_max_rows)
    return DraftModelDrafter(draft, max_len, kv_cache)
