"""Sampling: validated parameters and the logits transforms shared by plain and speculative decoding.

Order (the same as transformers): repetition penalty on the raw logits, then temperature, top-k, top-p, min-p.
`distribution()` gives the final probabilities; speculative verification (verify.py) applies the same function to
both the draft and the target logits so that rejection sampling keeps the target distribution exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edge.errors import SamplingError


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    min_p: float = 0.0  # 0 disables
    repetition_penalty: float = 1.0  # 1 disables
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                     f"{name} must be a number, got {value!r}")
        _require(self.temperature >= 0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _require(_is_int(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        _require(0 < self.top_p <= 1, f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        _require(0 <= self.min_p <= 1, f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        _require(self.repetition_penalty > 0, f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        _require(self.seed is None or _is_int(self.seed) and SEED_RANGE[0] <= self.seed <= SEED_RANGE[1],
                 f"seed must be an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]}, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SamplingError(message)


def apply_repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits (..., V); history (N,) token ids seen so far. Seen tokens' logits are divided (if > 0) or
    multiplied (if < 0) by `penalty`, as in the CTRL paper and transformers."""
    if penalty == 1.0 or history.numel() == 0:
        return logits
    index = history.expand(*logits.shape[:-1], history.shape[-1])  # (..., N)
    seen = logits.gather(-1, index)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits.scatter(-1, index, seen)


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p on logits (..., V); removed tokens get -inf. Needs temperature > 0."""
    logits = logits.float()
    temperature = max(params.temperature, torch.finfo(torch.float32).tiny)  # a smaller one is 0 in float32
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature  # the top token at 0: no overflow at tiny T
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (..., V)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of all tokens ranked above this one
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False  # the first token always stays, even for a top_p float32 rounds to 0
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if params.min_p > 0.0:
        probs = logits.softmax(-1)
        threshold = params.min_p * probs.max(dim=-1, keepdim=True).values  # (..., 1)
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def distribution(logits: torch.Tensor, params: SamplingParams, history: torch.Tensor) -> torch.Tensor:
    """Final sampling probabilities (..., V) from raw logits; for greedy, a one-hot on the argmax."""
    logits = apply_repetition_penalty(logits, history, params.repetition_penalty)
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return warp(logits, params).softmax(-1)


def history_tensor(tokens: list[int], params: SamplingParams, device: torch.device | str) -> torch.Tensor:
    """The token ids the repetition penalty looks at (empty when it is off, to skip building the tensor)."""
    if params.repetition_penalty == 1.0:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.tensor(tokens, dtype=torch.long, device=device)


def next_token(logits: torch.Tensor, params: SamplingParams, history: torch.Tensor, generator: torch.Generator) -> int:
    """Choose one token from logits (V,) of the last position."""
    logits = apply_repetition_penalty(logits, history, params.repetition_penalty)
    if params.greedy:
        return int(logits.argmax(-1))
    probs = warp(logits, params).softmax(-1)  # (V,)
    return int(torch.multinomial(probs, 1, generator=generator))
