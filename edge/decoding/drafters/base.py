"""The Drafter interface: a source of guessed tokens that the target verifies in one pass.

    propose(tokens, k, sampler)  -> Draft   up to k tokens continuing `tokens` (+ their probabilities)
    observe(accepted, drafted, step_s)      what verification kept and the step's time, to adapt
    reset()                                 forget any per-conversation state
    memory_bytes()                          what the drafter holds beyond the target (weights, caches)

`tokens` is the whole sequence so far; the target's cache holds all of it but the last token. A drafter may stop
before k tokens when its confidence falls below `sampler.stop_below` (adaptive draft length).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from edge.decoding.sampling import SamplingParams, apply_repetition_penalty, greedy_ids, warp
from edge.kernels.records import DraftRequest, FeatureRows, KernelDraft, KernelHead


@dataclass
class Branch:
    """A drafted token beside the chain, verified in the same pass as a node of a token tree."""

    token: int
    parent: int  # the node it continues: -1 the last token before the draft, j < n the chain's token j, n + i branch i
    reach: float  # the drafter's probability that the target's path runs through it (its path's product)


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None = None  # (n, V) sampling distributions the tokens were drawn from; None: deterministic
    confidences: list[float] = field(default_factory=list)  # the drafter's probability of each token
    # greedy drafts for a token tree: other candidates, likeliest first, each after its parent (so any first m of
    # them with the chain form a tree)
    branches: list[Branch] | None = None

    @classmethod
    def from_kernel(cls, drafted: KernelDraft) -> "Draft":
        """From one-call greedy drafting (edge.model.kernel_glue.draft_greedy): the runners-up, where they were asked
        for, become branches (leaves beside the chain token each would replace)."""
        if drafted.runners_up is None:
            return cls(tokens=drafted.tokens)
        confidences = [first for first, _ in drafted.probabilities]
        return cls(tokens=drafted.tokens, confidences=confidences,
                   branches=runner_up_branches(confidences, [(token, second) for token, (_, second)
                                                             in zip(drafted.runners_up, drafted.probabilities)]))


def runner_up_branches(confidences: list[float], runners_up: list[tuple[int, float]]) -> list[Branch]:
    """A chain's runners-up (token, probability at position j) as branches: leaves beside chain token j, reached
    where the chain reaches j, likeliest first."""
    branches, reach = [], 1.0
    for j, ((token, probability), confidence) in enumerate(zip(runners_up, confidences)):
        branches.append(Branch(token, j - 1, reach * probability))
        reach *= confidence
    return sorted(branches, key=lambda branch: -branch.reach)


@dataclass
class DraftSampler:
    """How a model-based drafter picks tokens: the caller's sampling parameters, generator and stop threshold."""

    params: SamplingParams
    generator: torch.Generator
    stop_below: float | None = None  # stop drafting when the next token's probability is below this
    vocab_size: int | None = None  # the target's vocabulary size (draft probabilities are over it)
    trees: bool = False  # greedy drafts also report branches (Draft.branches): the target may verify a token tree

    def request(self, tokens: list[int], start: int, cache, k: int, head: KernelHead, *,
                layers: list[int] | None = None, features: FeatureRows | None = None) -> DraftRequest:
        """A one-call greedy draft of k tokens (edge/kernels/records.py DraftRequest) with this sampler's confidence stop and,
        for token trees, runners-up."""
        return DraftRequest(tokens, start, cache, k, head, layers=layers, features=features,
                            stop_below=self.stop_below, runners_up=self.trees)

    @property
    def plain_greedy(self) -> bool:
        """Whether picking is a bare argmax (greedy, no repetition penalty): what a drafter's one-call greedy path
        (edge.model.kernel_glue.draft_greedy) computes, confidence stop (`stop_below`) included."""
        return self.params.greedy and self.params.penalty == 1.0

    def pick(self, logits: torch.Tensor, history: list[int]) -> tuple[int, torch.Tensor | None, float]:
        """From the drafter's logits (V,) choose a token; return it, the distribution (None if greedy), its prob."""
        logits = _fit_vocab(logits.float(), self.vocab_size)
        if self.params.penalty != 1.0:
            logits = apply_repetition_penalty(logits, torch.tensor(self.params.recent(history), device=logits.device),
                                              self.params.penalty)
        if self.params.greedy:
            token = int(greedy_ids(logits))
            confidence = float(logits.softmax(-1)[token]) if self.stop_below is not None else 1.0
            return token, None, confidence
        probs = warp(logits, self.params).softmax(-1)  # (V,)
        token = int(torch.multinomial(probs, 1, generator=self.generator))
        return token, probs, float(probs[token])


def _fit_vocab(logits: torch.Tensor, vocab_size: int | None) -> torch.Tensor:
    """Cut padding rows beyond the target's vocabulary, or pad a smaller vocabulary with impossible tokens."""
    if vocab_size is None or logits.shape[-1] == vocab_size:
        return logits
    if logits.shape[-1] > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - logits.shape[-1]), float("-inf"))
    return torch.cat((logits, pad), dim=-1)


class Drafter(Protocol):
    name: str

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft: ...

    def observe(self, accepted: int, drafted: int, step_s: float) -> None: ...

    def reset(self) -> None: ...

    def memory_bytes(self) -> int: ...

    # Optional, on drafters without weights or a cache of their own (ngram, retrieval): `fresh()` returns another
    # drafter with the same settings and read-only data for another sequence, so that each of a batch's sequences
    # drafts with its own state (edge/engine/batched.py). A drafter without it drafts for one sequence at a time.


def draft_autoregressively(
    step: Callable[[list[int], int], torch.Tensor], tokens: list[int], first_feed: list[int], start: int, k: int,
    sampler: DraftSampler,
) -> Draft:
    """The drafting loop shared by model drafters.

    `step(feed, start)` runs the drafter over `feed` at positions [start, start + len(feed)) and returns the logits
    (V,) of the last one. The first call feeds `first_feed` (whatever the drafter's cache lacks, ending with the
    last token of `tokens`); each later call feeds the token just drafted."""
    draft = Draft(tokens=[])
    probs: list[torch.Tensor] = []
    feed, position = first_feed, start
    for _ in range(k):
        logits = step(feed, position)
        token, dist, confidence = sampler.pick(logits, tokens + draft.tokens)
        if sampler.stop_below is not None and draft.tokens and confidence < sampler.stop_below:
            break  # keep at least one token: an empty draft wastes the verify pass
        draft.tokens.append(token)
        draft.confidences.append(confidence)
        if dist is not None:
            probs.append(dist)
        position += len(feed)
        feed = [token]
    if probs:
        draft.probs = torch.stack(probs)  # (n, V)
    return draft
