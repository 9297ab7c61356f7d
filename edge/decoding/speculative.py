"""Speculative decoding: draft -> verify in one target pass -> accept, as a `DecodingStrategy`.

    tokens (cache holds all but the last)
      draft  = drafter.propose(tokens, k)                          n <= k tokens (+ probabilities)
      logits = target([last] + draft) at positions len-1 ...        one pass over n + 1 tokens
      verdict = verify(draft, logits)                               accepted a <= n, then one target token
      cache.rollback(len(tokens) + a)                               drop the rejected drafts' keys/values
      emit draft[:a] + [next];  drafter.observe(a, n);  k adapts

The cache invariant holds after the step: it holds every emitted token but the last.

Token trees (Sequoia, DySpec, EAGLE-2): in greedy decoding with an adaptive length, on the fused CPU step, the pass
may also verify other candidates the drafter reports beside its chain (Draft.branches: a runner-up beside a chain
token, or for an EAGLE-3 head whole subtrees of its likeliest continuations), the likeliest first, as many as the
measured cost of the extra rows says pay (StepCosts.tree_branches). The target's argmax is followed down the tree
from the first row; the accepted path's keys/values are moved into place and the rest dropped, so the output is
still the target's own greedy output.

Under a grammar (structured output: edge/decoding/constrained.py) the verify pass masks each position's logits with the
grammar's state advanced along the drafts before it, and a draft is cut at the first token the grammar forbids
(the target's masked choice can never be it), so greedy output is plain constrained greedy output.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from edge.decoding.loop import Step
from edge.decoding.drafters.base import Branch, Draft, DraftSampler, Drafter
from edge.errors import SamplingError
from edge.model.kv_cache import KVCache
from edge.model.kernel_glue import verifies_trees
from edge.model.transformer import Transformer, keep_rows
from edge.decoding.sampling import (SamplingParams, candidate_distributions, distribution, greedy_ids, history_tensor,
                                   penalised_rows)
from edge.decoding.verify import Verdict, verify_greedy, verify_stochastic

if TYPE_CHECKING:
    from edge.decoding.constrained import Constraint


# adaptive draft length starts at 2 and then follows the measured costs (StepCosts)
ADAPTIVE_START = 2
PROBE_EVERY = 32  # steps of plain decoding after which a paused adaptive length drafts again, to measure anew
PLAIN_PROBE_AFTER = 8  # drafted steps after which a drafter that always proposes gets one plain step measured
DRAFTS_BEFORE_PAUSE = 4  # drafted steps since (re)starting before the length may pause: a few rejections in a row
# would otherwise pause a drafter that pays for 32 steps at a time (a reply of 128 tokens is about 40 steps)


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

    def observe(self, accepted: int, drafted: int, draft_s: float, verify_s: float, rows: int | None = None,
                drafting_measured: bool = True) -> None:
        """After a step: `accepted` of `drafted` chain tokens, a verify pass of `rows` rows (default drafted + 1).
        `drafting_measured` False: draft_s is not what a drafted token costs (the first draft after a pause, in which
        a drafter with its own cache also caught up on every token it skipped)."""
        rows, keep = rows or drafted + 1, 1.0 - self.smoothing
        count = self.seen.get(rows, 0)
        old = self.verify.get(rows, verify_s)
        self.verify[rows] = min(old, verify_s) if count < 3 else keep * old + self.smoothing * verify_s
        self.seen[rows] = count + 1
        if drafted and drafting_measured:
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
        best, best_rate = min_k, -1.0
        for k in range(min_k, min(max_k, max(self.verify)) + 1):
            rate = self.expected_rate(k, self.verify_estimate(k + 1))
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def expected_rate(self, k: int, verify: float) -> float:
        """Expected tokens per second of a step that drafts k tokens and verifies them in `verify` seconds."""
        a = min(self.acceptance, 0.999)
        return (1.0 - a ** (k + 1)) / (1.0 - a) / (verify + k * (self.draft_per_token or 0.0))

    def plain_pays(self, k: int) -> bool:
        """Whether a plain step (one row, nothing drafted), as measured, makes tokens faster than drafting k tokens
        is expected to: the drafter does not pay on this model and machine at present."""
        plain, verify = self.verify.get(1), self.verify_estimate(k + 1)
        if plain is None or verify is None or self.draft_per_token is None:
            return False
        return 1.0 / plain > self.expected_rate(k, verify)

    def verify_estimate(self, rows: int) -> float | None:
        """A verify pass of `rows` rows: as measured, else the dearest pass of fewer rows measured (fewer rows than
        any measured: the cheapest measured), so a row count is tried once before its own cost decides; None with
        nothing measured, or past one row beyond the largest measured."""
        if rows in self.verify:
            return self.verify[rows]
        if not self.verify or rows > max(self.verify) + 1:
            return None
        fewer = [cost for count, cost in self.verify.items() if count < rows]
        return max(fewer) if fewer else min(self.verify.values())

    def tree_branches(self, confidences: list[float], reaches: list[float]) -> int:
        """How many of a draft's branches (likeliest first, each with `reaches`: the drafter's probability that the
        target's path runs through it) to verify beside its chain of `confidences`: a branch adds its reach to the
        expected tokens of the step. The count with the most expected tokens per second of drafting plus verifying,
        counting each row at its measured cost; 0 where extra rows do not pay."""
        n = len(confidences)
        if n == 0 or self.draft_per_token is None:
            return 0
        reach, expected = 1.0, 1.0
        for confidence in confidences:
            reach *= confidence
            expected += reach
        drafting = n * self.draft_per_token
        base = self.verify_estimate(n + 1)
        if base is None:
            return 0
        best, best_rate = 0, expected / (base + drafting)
        for taken, gain in enumerate(reaches, start=1):
            expected += gain
            cost = self.verify_estimate(n + 1 + taken)
            if cost is None:
                break
            if expected / (cost + drafting) > best_rate:
                best, best_rate = taken, expected / (cost + drafting)
        return best


@dataclass
class DraftLength:
    """How many tokens to draft per step: fixed, or adaptive.

    Adaptive picks, after every step, the k with the most expected tokens per second from what this engine has
    measured (StepCosts: verify passes by row count, drafting per token, the running acceptance), within
    [min_k, max_k]; where a plain step, as measured, makes tokens faster than the best k would, it pauses (k = 0:
    plain decoding; not before DRAFTS_BEFORE_PAUSE drafted steps since it started or resumed) and drafts again after
    PROBE_EVERY steps to measure anew, so a drafter that cannot pay costs
    little more than plain decoding. Where a verify pass of a few rows costs about one step (memory-bound decoding)
    it drafts longer; where every row costs compute (a model in cache) shorter. In interleaved suites this rule measured
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
    paused_steps: int = 0  # plain steps taken since the length paused (k = 0)
    resuming: bool = False  # the next draft is the first after a pause: its drafting time includes catching up
    drafted_steps: int = 0  # drafted steps since the length started or last resumed from a pause

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

    def update(self, accepted: int, drafted: int, draft_s: float | None = None, verify_s: float | None = None,
               rows: int | None = None, pausable: bool = True) -> None:
        """After a step that drafted `drafted` tokens, `accepted` of them, in draft_s + verify_s seconds (a verify
        pass of `rows` rows: drafted + 1 unless a token tree added some). Without
        timings (sampled decoding, where a seed must give the same output on every run, and times never repeat)
        k follows acceptance alone: +1 after a wholly accepted draft, else the tokens accepted + 1 (at most k - 1).
        `pausable` False: never pause (a drafter that proposes only where it has evidence, and costs nothing where
        it has none, as n-gram lookup: its average acceptance undersells its strong matches)."""
        if not self.adaptive:
            return
        timed = draft_s is not None and verify_s is not None and verify_s > 0.0
        if drafted == 0:  # a plain step: paused, or the drafter had nothing to propose
            if timed and rows in (None, 1):
                self.costs.observe(0, 0, draft_s, verify_s, 1)
            if self.k == 0:
                self.paused_steps += 1
                if self.paused_steps >= PROBE_EVERY:
                    self.k, self.paused_steps = self.costs.best_length(self.min_k, self.max_k), 0
                    self.resuming, self.drafted_steps = True, 0
            return
        if timed:
            self.costs.observe(accepted, drafted, draft_s, verify_s, rows, drafting_measured=not self.resuming)
            self.resuming = False
            best = self.costs.best_length(self.min_k, self.max_k)
            self.drafted_steps += 1
            settled = self.drafted_steps >= DRAFTS_BEFORE_PAUSE
            self.k = 0 if pausable and settled and self.costs.plain_pays(best) else best
            if pausable and 1 not in self.costs.verify and sum(self.costs.seen.values()) >= PLAIN_PROBE_AFTER:
                self.k, self.paused_steps = 0, PROBE_EVERY - 1  # one plain step, to measure what drafting must beat
        else:
            self.k = min(self.k + 1, self.max_k) if accepted == drafted else \
                max(min(self.k - 1, accepted + 1), self.min_k)


def verify_rows(params: SamplingParams, tokens: list[int], draft: Draft, logits: torch.Tensor,
                generator: torch.Generator) -> Verdict:
    """The verdict on `draft` from the target's logits (n + 1, V) at the rows after tokens[-1] and each drafted
    token: greedy, or stochastic under `params` (each position penalised by the tokens before it, as plain decoding
    does at that position)."""
    device = logits.device
    if params.penalty != 1.0:
        seen = tokens + draft.tokens
        histories = [history_tensor(seen[: len(tokens) + i], params, device) for i in range(len(logits))]
        # (n + 1, V): position i has seen the drafts before it (the newest repeat_last_n tokens, as plain)
        logits = penalised_rows(logits, histories, params.penalty)
    if params.greedy:
        return verify_greedy(draft.tokens, greedy_ids(logits))
    unpenalised = dataclasses.replace(params, repetition_penalty=1.0)  # already applied above
    candidates = candidate_distributions(logits, unpenalised)  # (n + 1, k) each: top-k's handful per position
    if candidates is not None:
        probs, ids = candidates
        return verify_stochastic(draft.tokens, draft.probs, probs, generator, target_ids=ids)
    no_history = torch.empty(0, dtype=torch.long, device=device)
    target_probs = distribution(logits, unpenalised, no_history)  # (n + 1, V)
    return verify_stochastic(draft.tokens, draft.probs, target_probs, generator)


class SpeculativeDecoding:
    name = "speculative"

    def __init__(self, model: Transformer, cache: KVCache, params: SamplingParams, generator: torch.Generator,
                 drafter: Drafter, length: DraftLength, constraint: "Constraint | None" = None) -> None:
        params = params.resolved()  # the repetition penalty in force, as drafters read it
        self.model, self.cache, self.params, self.generator = model, cache, params, generator
        self.drafter, self.length = drafter, length
        self.constraint = constraint  # a grammar: the verify pass masks each position (edge/decoding/constrained.py)
        self.pausable = getattr(drafter, "pausable", True)  # see DraftLength.update
        self.device = model.device
        self.sampler = DraftSampler(params, generator, length.stop_below, model.config.vocab_size)
        # token trees: chosen step by step by measured costs (not under a grammar, whose masks follow one chain), where
        # the model's fused CPU step verifies them (an exported model's backend does not)
        self.sampler.trees = (self.sampler.plain_greedy and length.adaptive and isinstance(model, Transformer)
                              and verifies_trees(model, cache) and constraint is None)
        self.tree_rows_limit = next((rows for rows in (64, 32, 16, 8, 4) if self.sampler.trees
                                     and verifies_trees(model, cache, rows)), 2)  # the most rows a verify pass holds
        self.tree_rows = 0  # rows token trees have added to verify passes so far, and the branch tokens accepted
        self.tree_accepted = 0

    def step(self, tokens: list[int], budget: int) -> Step:
        t0 = time.perf_counter()
        k = min(self.length.k, budget - 1)  # the step also emits the target's own token
        draft = self.drafter.propose(tokens, k, self.sampler) if k > 0 else Draft(tokens=[])
        masks = None
        if self.constraint is not None:  # cut at the first token the grammar forbids (sampling: keep it, rejected)
            draft, masks = self.constraint.check_draft(draft, keep_rejected=not self.params.greedy)  # (n + 1, V)
        room = self.tree_rows_limit - 1 - len(draft.tokens)
        taken = (self.length.costs.tree_branches(draft.confidences, [b.reach for b in draft.branches[:max(room, 0)]])
                 if draft.branches else 0)
        t1 = time.perf_counter()
        start = len(tokens) - 1
        if taken:
            return self._tree_step(tokens, draft, draft.branches[:taken], start, t0, t1)
        feed = torch.tensor([[tokens[-1], *draft.tokens]], device=self.device)  # (1, n + 1)
        logits = self.model.forward_logits(feed, start, self.cache)[0].float()  # (n + 1, V)
        if masks is not None:
            logits = logits.masked_fill(~masks.to(logits.device), float("-inf"))
        t2 = time.perf_counter()
        verdict = self._verify(tokens, draft, logits)
        self.cache.rollback(start + 1 + verdict.accepted)
        t3 = time.perf_counter()
        timings = (t1 - t0, t2 - t1) if self.params.greedy else ()  # a seeded sample must not depend on time
        self.length.update(verdict.accepted, len(draft.tokens), *timings, pausable=self.pausable)
        self.drafter.observe(verdict.accepted, len(draft.tokens), t3 - t0)
        emitted = verdict.tokens(draft.tokens)
        if self.constraint is not None:
            self.constraint.consume(emitted)
        return Step(tokens=emitted, drafted=[True] * verdict.accepted + [False], drafted_count=len(draft.tokens),
                    draft_s=t1 - t0, verify_s=t2 - t1, sample_s=t3 - t2)

    def _tree_step(self, tokens: list[int], draft: Draft, branches: list[Branch], start: int, t0: float,
                   t1: float) -> Step:
        """Verify the drafted chain and `branches` in one pass (greedy): rows are the last token, the chain (row
        j + 1 continues row j) and a row per branch (continuing its parent node's row: node i is row i + 1)."""
        n = len(draft.tokens)
        feed_tokens = [tokens[-1], *draft.tokens, *(branch.token for branch in branches)]
        parents = [-1, *range(n), *(branch.parent + 1 for branch in branches)]
        feed = torch.tensor([feed_tokens], device=self.device)  # (1, rows)
        logits = self.model.forward_logits(feed, start, self.cache, parents=parents)[0]  # (rows, V)
        t2 = time.perf_counter()
        choices = logits.argmax(-1).tolist()  # the target's greedy token after each row
        children: dict[int, dict[int, int]] = {}
        for row in range(1, len(feed_tokens)):
            children.setdefault(parents[row], {})[feed_tokens[row]] = row
        path, row = [], 0
        while (child := children.get(row, {}).get(choices[row])) is not None:
            path.append(child)
            row = child
        keep_rows(self.model, start, [0, *path], self.cache)  # the accepted path's keys/values into place
        t3 = time.perf_counter()
        on_chain = sum(1 for i, row in enumerate(path) if row == i + 1)  # chain tokens accepted, from the first
        self.tree_rows += len(branches)
        self.tree_accepted += len(path) - on_chain
        self.length.update(on_chain, n, t1 - t0, t2 - t1, rows=len(feed_tokens), pausable=self.pausable)
        self.drafter.observe(len(path), n, t3 - t0)
        emitted = [feed_tokens[row] for row in path] + [choices[row]]
        return Step(tokens=emitted, drafted=[True] * len(path) + [False], drafted_count=n,
                    draft_s=t1 - t0, verify_s=t2 - t1, sample_s=t3 - t2)

    def _verify(self, tokens: list[int], draft: Draft, logits: torch.Tensor) -> Verdict:
        return verify_rows(self.params, tokens, draft, logits, self.generator)
