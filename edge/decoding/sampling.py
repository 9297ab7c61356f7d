"""Sampling: the generation options every front shares, declared once, and the logits transforms shared by plain and
speculative decoding.

SamplingParams is the options record (as vLLM's): each field carries its limits and help text (`option()`), and
everything else derives from it: GenerationOptions (edge/engine/options.py) adds the engine's own options and checks
a reply's; edge-chat's and edge-serve's flags (edge/frontend/options.py), the chat app's settings form (edge/tui) and
edge-serve's request schema (edge/serve/schemas.py) are built from `OPTIONS`, so every front takes the same values.

Order (the same as transformers): repetition penalty on the raw logits, then temperature, top-k, top-p, min-p.
`distribution()` gives the final probabilities; speculative verification (verify.py) applies the same function to
both the draft and the target logits so that rejection sampling keeps the target distribution exactly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from edge.errors import SamplingError


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
MAX_STOP_STRINGS = 4  # as OpenAI's API


@dataclass(frozen=True)
class Limits:
    """What one option takes and what it does: the one place its fronts read them from."""

    kind: type  # int, float, or str for a list of strings
    help: str  # what it does: --help, the settings form, the request schema's description
    metavar: str  # the value in --help
    note: str = ""  # what a special value means, e.g. "0 = greedy"
    low: float | None = None
    high: float | None = None
    above_low: bool = False  # low itself is refused
    optional: bool = False  # None is taken too
    most: int | None = None  # a list of strings: at most this many, none empty

    def bounds(self) -> str:
        """The range in words: "from 0 to 2", "above 0, at most 1", "at least 1", "at most 4 non-empty strings"."""
        if self.kind is str:
            return f"at most {self.most} non-empty strings"
        if self.low is not None and self.high is not None and not self.above_low:
            return f"from {_text(self.low)} to {_text(self.high)}"
        low = None if self.low is None else f"{'above' if self.above_low else 'at least'} {_text(self.low)}"
        high = None if self.high is None else f"at most {_text(self.high)}"
        return ", ".join(part for part in (low, high) if part)

    def accepts(self, value: object) -> bool:
        if value is None:
            return self.optional
        if self.kind is str:
            return (isinstance(value, tuple) and len(value) <= self.most
                    and all(isinstance(text, str) and text for text in value))
        numbers = (int, float) if self.kind is float else int
        if isinstance(value, bool) or not isinstance(value, numbers) or not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.above_low else value >= self.low)
        return above and (self.high is None or value <= self.high)

    def check(self, value: object, label: str) -> None:
        """Raise SamplingError (one line: the option as `label` names it, its limits, the value) unless taken."""
        if not self.accepts(value):
            kind = {int: "an integer", float: "a number", str: "a string or a list of strings"}[self.kind]
            terms = "; ".join(part for part in (self.bounds(), self.note) if part)
            raise SamplingError(f"{label} must be {kind} ({terms}), got {value!r}")

    def usage(self, default: object = dataclasses.MISSING) -> str:
        """Help text: what it does, what special values mean, the range, and for a flag (`default` given) its default,
        or for a list that it is repeated."""
        parts = [self.note, self.bounds()]
        if default is not dataclasses.MISSING:  # a flag's
            parts.append("repeatable" if self.kind is str else f"default: {_text(default)}")
        return f"{self.help} ({'; '.join(part for part in parts if part)})"


def _text(number: float | None) -> str:
    return "none" if number is None else f"{number:g}" if isinstance(number, float) else str(number)


def option(default: object, limits: Limits) -> dataclasses.Field:
    return dataclasses.field(default=default, metadata={"limits": limits})


@dataclass(frozen=True)
class SamplingParams:
    """The options of one reply that every front takes (the library, edge-chat's and edge-serve's flags, the chat
    app's settings, edge-serve's requests), each with its limits; checked when made."""

    max_new_tokens: int = option(256, Limits(int, "the most tokens a reply generates", "N", low=1))
    # 0 to 2, as OpenAI's API: edge-serve takes every value a client may send, and every front the same ones. Above
    # 2 a model's distribution is close to uniform over its vocabulary: noise, not a hotter reply
    temperature: float = option(0.0, Limits(float, "sampling temperature: divides the logits", "T", "0 = greedy",
                                            low=0, high=2))
    top_k: int = option(0, Limits(int, "keep the k most likely tokens", "K", "0 = off", low=0))
    top_p: float = option(1.0, Limits(float, "nucleus sampling: keep the most likely tokens that hold this "
                                             "much of the probability", "P", "1 = off", low=0, high=1, above_low=True))
    min_p: float = option(0.0, Limits(float, "drop the tokens less likely than min-p times the top token's "
                                             "probability", "P", "0 = off", low=0, high=1))
    # 0.01 to 100 keeps the penalized logits finite
    repetition_penalty: float = option(1.0, Limits(float, "penalize the tokens already seen, dividing their "
                                                          "logits by this", "X", "1 = off", low=0.01, high=100))
    seed: int | None = option(None, Limits(int, "seed for reproducible sampling", "N", "none = random",
                                           low=SEED_RANGE[0], high=SEED_RANGE[1], optional=True))
    stop: tuple[str, ...] = option((), Limits(str, "a stop string: the reply is cut before the first one", "TEXT",
                                              most=MAX_STOP_STRINGS))

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise SamplingError (one line, naming the field, its limits and the value) for a value out of range."""
        for name, limits in OPTIONS.items():
            limits.check(getattr(self, name), name)

    def options(self) -> dict:
        """The shared options' values by name (a GenerationOptions' too, without the engine's own)."""
        return {name: getattr(self, name) for name in OPTIONS}

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


# the record's fields in order, as the fronts walk them: name -> limits, and name -> default
OPTIONS: dict[str, Limits] = {field.name: field.metadata["limits"] for field in dataclasses.fields(SamplingParams)}
DEFAULTS: dict[str, object] = {field.name: field.default for field in dataclasses.fields(SamplingParams)}


def label(name: str) -> str:
    """An option's name as the command line and the settings form write it: top_p -> top-p (the flag: --top-p)."""
    return name.replace("_", "-")


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
