"""Speculative decoding: draft -> verify in one target pass -> accept, as a `DecodingStrategy`.

    tokens (cache holds all but the last)
      draft  = drafter.propose(tokens, k)                          n <= k tokens (+ probabilities)
      logits = target([last] + draft) at positions len-1 ...        one pass over n + 1 tokens
      verdict = verify(draft, logits)                               accepted a <= n, then one target token
      cache.rollback(len(tokens) + a)                               drop the rejected drafts' keys/values
      emit draft[:a] + [next];  drafter.observe(a, n);  k adapts

The cache invariant holds after the step: it holds every emitted token but the last.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from edge.decoding import Step
from edge.drafters.base import Draft, DraftSampler, Drafter
from edge.errors import SamplingError
from edge.kv_cache import KVCache
from edge.model import Transformer
from edge.sampling import SamplingParams, apply_repetition_penalty, distribution
from edge.verify import Verdict, verify_greedy, verify_stochastic


# adaptive draft length starts at 2: with extra verify rows costing compute, starting at 4 cost the drafters whose
# best fixed k is 1 or 2 a few percent per reply in interleaved runs (docs/history/benchmarks-2026-11-21.md, round 6)
ADAPTIVE_START = 2


@dataclass
class DraftLength:
    """How many tokens to draft per step: fixed, or adaptive.

    Adaptive follows recent acceptance (the engine starts it at k=2): after a fully accepted draft k grows by 1;
    after a rejection it drops to the tokens accepted + 1 (at most k - 1), within [min_k, max_k]. The drop measured
    level with or slightly ahead of shrinking by one (docs/architecture.md); growing by 1 rather than 2 brought every
    drafter within 5% of its best fixed k in an interleaved suite, now that each extra verify row costs compute
    (docs/history/benchmarks-2026-11-21.md, round 6). Optionally a drafter also stops early when its probability for
    the next token is below `stop_below` (SpecDec++/Kangaroo). On the built-in pair this rule measured level with the
    best fixed k, while the expected-gain rule of Leviathan et al. (pick k from the running acceptance and draft/verify cost
    ratio) and any confidence threshold measured slower; see docs/history/benchmarks-2026-11-21.md."""

    k: int = 4
    adaptive: bool = True
    min_k: int = 1
    max_k: int = 12
    stop_below: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise SamplingError(f"draft length k must be an integer >= 1, got {self.k!r}")
        if not 1 <= self.min_k <= self.max_k:
            raise SamplingError(f"draft length bounds need 1 <= min_k <= max_k, got {self.min_k} and {self.max_k}")
        if not self.adaptive:
            self.stop_below = None
        self.k = min(max(self.k, self.min_k), self.max_k) if self.adaptive else self.k

    @property
    def longest(self) -> int:
        """The most tokens one step can draft."""
        return self.max_k if self.adaptive else self.k

    @classmethod
    def fixed(cls, k: int) -> "DraftLength":
        return cls(k=k, adaptive=False)

    @classmethod
    def parse(cls, value: int | str) -> "DraftLength":
        """'adaptive' (starting at ADAPTIVE_START), 'adaptive:P' (and a confidence stop at probability P) or k."""
        if value == "adaptive":
            return cls(k=ADAPTIVE_START)
        if isinstance(value, str) and value.startswith("adaptive:"):
            try:
                stop_below = float(value.removeprefix("adaptive:"))
            except ValueError:
                stop_below = -1.0
            if not 0.0 < stop_below < 1.0:
                raise SamplingError(f"draft length {value!r}: the confidence stop after 'adaptive:' must be a "
                                    "probability between 0 and 1, e.g. adaptive:0.3")
            return cls(k=ADAPTIVE_START, stop_below=stop_below)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise SamplingError(f"draft length must be 'adaptive', 'adaptive:P' or a whole number >= 1, "
                                f"got {value!r}")
        return cls.fixed(value)

    def update(self, accepted: int, drafted: int) -> None:
        if not self.adaptive or drafted == 0:
            return
        self.k = min(self.k + 1, self.max_k) if accepted == drafted else max(min(self.k - 1, accepted + 1), self.min_k)


class SpeculativeDecoding:
    name = "speculative"

    def __init__(self, model: Transformer, cache: KVCache, params: SamplingParams, generator: torch.Generator,
                 drafter: Drafter, length: DraftLength) -> None:
        self.model, self.cache, self.params, self.generator = model, cache, params, generator
        self.drafter, self.length = drafter, length
        self.device = model.device
        self.sampler = DraftSampler(params, generator, length.stop_below, model.config.vocab_size)

    def step(self, tokens: list[int], budget: int) -> Step:
        t0 = time.perf_counter()
        k = min(self.length.k, budget - 1)  # the step also emits the target's own token
        draft = self.drafter.propose(tokens, k, self.sampler) if k > 0 else Draft(tokens=[])
        t1 = time.perf_counter()
        feed = torch.tensor([[tokens[-1], *draft.tokens]], device=self.device)  # (1, n + 1)
        start = len(tokens) - 1
        logits = self.model.forward_logits(feed, start, self.cache)[0].float()  # (n + 1, V)
        t2 = time.perf_counter()
        verdict = self._verify(tokens, draft, logits)
        self.cache.rollback(start + 1 + verdict.accepted)
        t3 = time.perf_counter()
        self.length.update(verdict.accepted, len(draft.tokens))
        self.drafter.observe(verdict.accepted, len(draft.tokens), t3 - t0)
        emitted = verdict.tokens(draft.tokens)
        return Step(tokens=emitted, drafted=[True] * verdict.accepted + [False], drafted_count=len(draft.tokens),
                    draft_s=t1 - t0, verify_s=t2 - t1, sample_s=t3 - t2)

    def _verify(self, tokens: list[int], draft: Draft, logits: torch.Tensor) -> Verdict:
        if self.params.repetition_penalty != 1.0:
            logits = torch.stack([
                apply_repetition_penalty(row, torch.tensor(tokens + draft.tokens[:i], device=self.device),
                                         self.params.repetition_penalty)
                for i, row in enumerate(logits)
            ])  # (n + 1, V): position i has seen the drafts before it
        if self.params.greedy:
            return verify_greedy(draft.tokens, logits.argmax(-1))
        no_history = torch.empty(0, dtype=torch.long, device=self.device)
        unpenalised = dataclasses.replace(self.params, repetition_penalty=1.0)  # already applied above
        target_probs = distribution(logits, unpenalised, no_history)  # (n + 1, V)
        return verify_stochastic(draft.tokens, draft.probs, target_probs, self.generator)
