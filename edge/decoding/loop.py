"""Decoding strategies behind one narrow interface.

The loop invariant every strategy keeps: before and after `step`, the cache holds every token of `tokens` but the
last one (`cache.length == len(tokens) - 1`). A step feeds that last token (plus, for speculative strategies, the
drafted ones) through the target in one pass and returns the tokens it emits, with their provenance and timings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from edge.model.kv_cache import KVCache
from edge.model.transformer import Transformer
from edge.decoding.sampling import SamplingParams, history_tensor, next_token

if TYPE_CHECKING:
    from edge.decoding.constrained import Constraint


@dataclass(frozen=True)
class Step:
    tokens: list[int]  # emitted this step, in order (at least one)
    drafted: list[bool]  # per token: proposed by a drafter and accepted
    drafted_count: int = 0  # tokens the drafter proposed this step
    draft_s: float = 0.0
    verify_s: float = 0.0
    sample_s: float = 0.0


class DecodingStrategy(Protocol):
    name: str

    def step(self, tokens: list[int], budget: int) -> Step:
        """Emit between 1 and `budget` tokens continuing `tokens`."""


class Autoregressive:
    """Plain decoding: one target forward, one token per step; with a `constraint`, only tokens its grammar allows."""

    name = "autoregressive"

    def __init__(self, model: Transformer, cache: KVCache, params: SamplingParams, generator: torch.Generator,
                 constraint: "Constraint | None" = None) -> None:
        self.model, self.cache, self.params, self.generator = model, cache, params.resolved(), generator
        self.constraint = constraint
        self.device = model.device

    def step(self, tokens: list[int], budget: int) -> Step:
        t0 = time.perf_counter()
        last = torch.tensor([tokens[-1:]], device=self.device)  # (1, 1)
        logits = self.model.forward_logits(last, len(tokens) - 1, self.cache)[0, -1]  # (V,)
        t1 = time.perf_counter()
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        token = next_token(logits, self.params, history_tensor(tokens, self.params, self.device), self.generator)
        if self.constraint is not None:
            self.constraint.consume([token])
        t2 = time.perf_counter()
        return Step(tokens=[token], drafted=[False], verify_s=t1 - t0, sample_s=t2 - t1)

