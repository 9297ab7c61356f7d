"""Hybrid drafting: prompt lookup when the context repeats itself, a draft model everywhere else.

    hybrid:SPEC     n-gram lookup with matches of at least `min_ngram` tokens (default 2), and the model drafter
                    SPEC (builtin, draft:PATH, bundle, early-exit:E ...) when there is no such match

A lookup draft costs nothing to make, so it is taken whenever the current suffix occurred before; the model drafter
runs only where copying has nothing to offer. It catches up on the tokens it did not see from its own cache (a draft
model re-feeds what it lacks; a layer-skip drafter reads the target's cache). Lossless like every drafter: the target
verifies each proposal.
"""

from __future__ import annotations

from edge.decoding.drafters.base import Draft, Drafter, DraftSampler
from edge.decoding.drafters.ngram import NGramDrafter
from edge.errors import SamplingError


class HybridDrafter:
    def __init__(self, model_drafter: Drafter, lookup: NGramDrafter | None = None) -> None:
        self.model_drafter = model_drafter
        self.lookup = lookup or NGramDrafter(max_ngram=4, min_ngram=2)
        self.name = f"hybrid:{model_drafter.name}"
        self.pausable = getattr(model_drafter, "pausable", True)  # the model drafter's cost decides
        self.lookups = self.model_drafts = 0  # how often each source drafted

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        draft = self.lookup.propose(tokens, k, sampler)
        if draft.tokens:
            self.lookups += 1
            return draft
        self.model_drafts += 1
        return self.model_drafter.propose(tokens, k, sampler)

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        self.model_drafter.observe(accepted, drafted, step_s)

    def reset(self) -> None:
        self.lookup.reset()
        self.model_drafter.reset()

    def memory_bytes(self) -> int:
        return self.model_drafter.memory_bytes()

    def trim_vocabulary(self, kept) -> None:
        if not hasattr(self.model_drafter, "trim_vocabulary"):
            raise SamplingError(f"the {self.model_drafter.name} drafter has no head to trim; a draft vocabulary "
                                "applies to draft models, layer-skip and feature drafters")
        self.model_drafter.trim_vocabulary(kept)
