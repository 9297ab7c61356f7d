"""Drafters: token-guess sources for speculative decoding, all behind the `Drafter` interface (base.py).

A drafter is named by a spec ("ngram:3", "early-exit", "hybrid:feature", "draft:PATH@vocab.json"), parsed in one
place, `DrafterSpec.parse`, and built from the registry of drafter kinds (edge/decoding/registry.py, above this
package: every kind, its text form, its builder and what the memory planner counts for it):

    ngram[:N]            prompt lookup with n-grams of up to N tokens (default 4); no weights
    early-exit[:E]       the target's first E layers and its head (default: a third of the layers)
    skip:L1,L2,...       the target without the listed layers
    adaptive             picks among early exits and a skip set at run time from measured speed
    quantspec[:B]        the target with B-bit weights (4 or 8; default 4) reading the upper 4 bits of its
                         hierarchical KV cache (QuantSpec; needs kv_cache="hierarchical", which it selects)
    draft:PATH | PATH    a separate small checkpoint with the same tokenizer (or an edge-export bundle's drafter)
    builtin              the built-in drafter shipped with the built-in model
    feature[:PATH]       a feature drafter (EAGLE-style: one layer over the target's hidden states) trained for
                         this target (default: the built-in model's)
    eagle3:PATH          a published EAGLE-3 head (a folder or a Hugging Face Hub id) over the target's low,
                         middle and high layers' residual streams
    bundle               the drafter an edge-export bundle carries (when the target runs from that bundle)
    hybrid:SPEC          n-gram lookup when the suffix (2+ tokens) occurred before, else the drafter SPEC
    SPEC@VOCAB.json      any model drafter above with its head trimmed to the token ids in VOCAB.json (VocabTrim;
                         make one with `python -m edge.export.vocab_trim`)
"""

from __future__ import annotations

from edge.decoding.drafters.base import Draft, Drafter, DraftSampler
from edge.decoding.drafters.draft_model import DraftModelDrafter
from edge.decoding.drafters.layer_skip import AdaptiveLayerSkipDrafter, LayerSkipDrafter
from edge.decoding.drafters.ngram import NGramDrafter

__all__ = ["Draft", "Drafter", "DraftSampler", "DraftModelDrafter", "LayerSkipDrafter", "AdaptiveLayerSkipDrafter",
           "NGramDrafter"]
