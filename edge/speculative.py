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


# adaptive draft length starts at 2 and then follows the measured costs (StepCosts)
ADAPTIVE_START = 2


@dataclass
class StepCosts:
    """What a speculative step costs on this model and machine, measured as it runs, and how often drafts are
    accepted: the inputs of the expected-gain rule (Leviathan et al.) that picks the draft length.

    `verify[rows]` is the running time of a verify pass of that many rows (a row count's first three passes keep
    their fastest, so a one-off warm-up does not count against it; then a running average), `draft_per_token` that
    of drafting one token, `acceptance` the running share of drafted tokens accepted where they were reached
    (a draft is read left to right; a token after a rejection was never tried). One table serves every reply of an
    engine: the costs belong to the model and the machine."""

    verify: dict[int, float] = dataclasses.field(default_factory=dict)
    seen: dict[int, int] = dataclasses.field(default_factory=dict)
    draft_per_token: float | None = None
    acceptance: float = 0.6
    smoothing: float = 0.2

    def observe(self, accepted: int, drafted: int, draft_s: float, verify_s: float) -> None:
        rows, keep = drafted + 1, 1.0 - self.smoothing
        count = self.seen.get(rows, 0)
        old = self.verify.get(rows, verify_s)
        self.verify[rows] = min(old, verify_s) if count < 3 else keep * old + self.smoothing * verify_s
        self.seen[rows] = count + 1
        if drafted:
            per_token = draft_s / drafted
            self.draft_per_token = per_token if self.draft_per_token is None else \
                keep * self.draft_per_token + self.smoothing * per_token
            tried = min(accepted + 1, drafted)
            self.acceptance = keep * self.acceptance + self.smoothing * accepted / tried

    def best_length(self, min_k: int, max_k: int) -> int:
        """The draft length with the most expected tokens per second: E(k) = 1 + a + ... + a^k tokens for a verify
        pass of k + 1 rows and k drafted tokens. A row count not yet measured is taken to cost the most any fewer
        rows measured (fewer rows than any measured: the cheapest measured), and only one row past the largest
        measured is tried, so the length explores upward one step at a time, and only while the measured costs say
        a longer draft pays."""
        if not self.verify:
            return min_k
        largest, a = max(self.verify), min(self.acceptance, 0.999)
        below = [cost for rows, cost in self.verify.items() if rows <= min_k]
        ceiling = max(below) if below else min(self.verify.values())  # the dearest pass of fewer rows, as k grows
        best, best_rate = min_k, -1.0
        for k in range(min_k, min(max_k, largest) + 1):
            verify = self.verify.get(k + 1, ceiling)
            ceiling = max(ceiling, verify)
            rate = (1.0 - a ** (k + 1)) / (1.0 - a) / (verify + k * (self.draft_per_token or 0.0))
            if rate > best_rate:
                best, best_rate = k, rate
        return best


@dataclass
class DraftLength:
    """How many tokens to draft per step: fixed, or adaptive.

    Adaptive picks, after every step, the k with the most expected tokens per second from what this engine has
    measured (StepCosts: verify passes by row count, drafting per token, the running acceptance), within
    [min_k, max_k]. Where a verify pass of a few rows costs about one step (memory-bound decoding) it drafts
    longer; where every row costs compute (a model in cache) shorter. In interleaved suites this rule measured
    level with or ahead of the best fixed k and of the grow-by-one/drop-to-accepted rule it replaced, on the
    500M-parameter-traffic target and on the built-in model (docs/benchmarks.md, "Draft length"). Sampled
    decoding keeps that older rule (`update` without timings), so that a seed reproduces its output. Optionally a
    drafter also stops early when its probability for the next token is below `stop_below` (SpecDec++/Kangaroo)."""

    k: int = 4
    adaptive: bool = True
    min_k: int = 1
    max_k: int = 12
    stop_below: float | None = None
    costs: StepCosts = dataclasses.field(default_factory=StepCosts)  # shared by copies: one table per engine

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

    def update(self, accepted: int, drafted: int, draft_s: float | None = None, verify_s: float | None = None) -> None:
        """After a step that drafted `drafted` tokens, `accepted` of them, in draft_s + verify_s seconds. Without
        timings (sampled decoding, where a seed must give the same output on every run, and times never repeat)
        k follows acceptance alone: +1 after a wholly accepted draft, else the tokens accepted + 1 (at most k - 1)."""
        if not self.adaptive or drafted == 0:
            return
        if draft_s is not None and verify_s is not None and verify_s > 0.0:
            self.costs.observe(accepted, drafted, draft_s, verify_s)
            self.k = self.costs.best_length(self.min_k, self.max_k)
        else:
            self.k = min(self.k + 1, self.max_k) if accepted == drafted else \
                max(min(self.k - 1, accepted + 1), self.min_k)


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
        timings = (t1 - t0, t2 - t1) if self.params.greedy else ()  # a seeded sample must not depend on time
        self.length.update(verdict.accepted, len(draft.tokens), *timings)
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
