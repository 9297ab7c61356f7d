"""Sampling: the generation options every front shares, declared once, and the logits transforms shared by plain and
speculative decoding.

SamplingParams is the options record (as vLLM's): each field carries its limits and help text (`option()`), and
everything else derives from it: GenerationOptions (edge/engine/options.py) adds the engine's own options and checks
a reply's; edge-chat's and edge-serve's flags (edge/frontend/options.py), the chat app's settings form (edge/tui) and
edge-serve's request schema (edge/serve/schemas.py) are built from `OPTIONS`, so every front takes the same values.

Order (the same as transformers): repetition penalty on the raw logits (over the newest `repeat_last_n` tokens, as
llama.cpp's), then temperature, top-k, top-p, min-p. `loop_stop` is not a transform: the reply loop ends a reply
whose newest tokens repeat one cycle (edge/decoding/repetition.py).
`distribution()` gives the final probabilities; speculative verification (verify.py) applies the same function to
both the draft and the target logits so that rejection sampling keeps the target distribution exactly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy
import torch

from edge.errors import SamplingError


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
SAMPLING_PENALTY = 1.1  # the repetition penalty when sampling and none is set (llama.cpp's and Ollama's)
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
    # The defaults are llama.cpp's and Ollama's (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, a repetition
    # penalty of 1.1 over the last 64 tokens) unless the model recommends its own (edge/decoding/recommended.py), with a
    # loop stop on top. 0 to 2, as OpenAI's API: edge-serve takes every value a client may send, and every front the
    # same ones. Above 2 a model's distribution is close to uniform over its vocabulary: noise, not a hotter reply
    temperature: float = option(0.8, Limits(float, "sampling temperature: divides the logits", "T", "0 = greedy",
                                            low=0, high=2))
    top_k: int = option(40, Limits(int, "keep the k most likely tokens", "K", "0 = off", low=0))
    top_p: float = option(0.95, Limits(float, "nucleus sampling: keep the most likely tokens that hold this "
                                              "much of the probability", "P", "1 = off", low=0, high=1,
                                       above_low=True))
    min_p: float = option(0.05, Limits(float, "drop the tokens less likely than min-p times the top token's "
                                              "probability", "P", "0 = off", low=0, high=1))
    # 0.01 to 100 keeps the penalized logits finite; none (the default): 1.1 when sampling, off when greedy
    repetition_penalty: float | None = option(None, Limits(
        float, "penalize the tokens among the last repeat-last-n, dividing their logits by this", "X",
        f"1 = off; none = {SAMPLING_PENALTY:g} when sampling, off when greedy", low=0.01, high=100, optional=True))
    repeat_last_n: int = option(64, Limits(int, "how many of the newest tokens the repetition penalty looks at", "N",
                                           "-1 = the whole context; 0 = none", low=-1))
    loop_stop: int = option(64, Limits(int, "end a reply whose newest tokens repeat one cycle of tokens, at least 3 "
                                            "times in a row, over this many tokens (finish reason: loop)", "N",
                                       "0 = off", low=0))
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

    @property
    def penalty(self) -> float:
        """The repetition penalty in force: the one set, else SAMPLING_PENALTY when sampling and none when greedy."""
        if self.repetition_penalty is not None:
            return self.repetition_penalty
        return 1.0 if self.greedy else SAMPLING_PENALTY

    def resolved(self) -> "SamplingParams":
        """These options with the repetition penalty in force written out (what decoding reads)."""
        if self.repetition_penalty == self.penalty:
            return self
        return dataclasses.replace(self, repetition_penalty=self.penalty)

    def recent(self, tokens: list[int]) -> list[int]:
        """The tokens the repetition penalty looks at: the newest repeat_last_n of `tokens` (all for -1)."""
        if self.penalty == 1.0 or self.repeat_last_n == 0:
            return []
        return list(tokens) if self.repeat_last_n < 0 else list(tokens[-self.repeat_last_n:])

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


def asked_over(defaults: dict, asked: dict) -> dict:
    """The options a user asked for (flags, a request's fields, a call's keywords) over `defaults` (edge's, a model's
    recommended ones, a server's). Greedy asked for (temperature 0) without a repetition penalty takes no penalty from
    the defaults: a greedy reply is guarded by the loop stop alone unless a penalty is asked for."""
    values = {**defaults, **asked}
    if asked.get("temperature") == 0 and asked.get("repetition_penalty") is None:
        values["repetition_penalty"] = None
    return values


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
    found = _top_k(logits, params.top_k)
    if found is not None:  # the same, computed on the k candidates alone
        values, index = found
        return torch.full_like(logits, float("-inf")).scatter(-1, index, _warp_sorted(values, params))
    temperature = max(params.temperature, torch.finfo(torch.float32).tiny)  # a smaller one is 0 in float32
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature  # the top token at 0: no overflow at tiny T
    if params.top_k and params.top_k < logits.shape[-1]:  # ties at the k-th logit: every tied token stays
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


def _top_k(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The k most likely tokens' logits (..., k), in descending order, and their ids; None where top-k is off or a
    tie at the k-th logit keeps more than k (warp's full path then keeps them all). A handful of candidates instead
    of the whole vocabulary: the rest of sampling then costs microseconds, not milliseconds, a token on a CPU."""
    if not top_k or top_k >= logits.shape[-1]:
        return None
    values, index = logits.topk(top_k + 1, dim=-1)  # (..., k + 1)
    if bool((values[..., top_k] == values[..., top_k - 1]).any()):
        return None
    return values[..., :top_k], index[..., :top_k]


def _warp_sorted(values: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """warp() on candidate logits (..., k) sorted in descending order (the top-k); removed ones get -inf."""
    temperature = max(params.temperature, torch.finfo(torch.float32).tiny)
    values = (values - values[..., :1]) / temperature
    if params.top_p < 1.0:
        probs = values.softmax(-1)
        drop = probs.cumsum(-1) - probs >= params.top_p  # the mass ranked above each one
        drop[..., 0] = False
        values = values.masked_fill(drop, float("-inf"))
    if params.min_p > 0.0:
        probs = values.softmax(-1)
        values = values.masked_fill(probs < params.min_p * probs[..., :1], float("-inf"))
    return values


def distribution(logits: torch.Tensor, params: SamplingParams, history: torch.Tensor) -> torch.Tensor:
    """Final sampling probabilities (..., V) from raw logits; for greedy, a one-hot on the argmax. `history`: the
    tokens the penalty looks at (history_tensor)."""
    logits = apply_repetition_penalty(logits, history, params.penalty)
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return warp(logits, params).softmax(-1)


def candidate_distributions(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Sampling probabilities (..., k) over each row's top-k candidate ids (..., k) from penalised logits (..., V):
    what distribution() gives, without its V-wide work, where top-k sampling keeps exactly k tokens in every row
    (else None: top-k off, or a tie at the k-th logit)."""
    found = _top_k(logits.float(), params.top_k)
    if found is None:
        return None
    values, index = found
    return _warp_sorted(values, params).softmax(-1), index


def penalised_rows(logits: torch.Tensor, histories: list[torch.Tensor], penalty: float) -> torch.Tensor:
    """apply_repetition_penalty on each row of logits (R, V) with its own history: one copy, each row's seen tokens
    rewritten in place (a token seen twice is penalised once, as there)."""
    if penalty == 1.0:
        return logits
    out = logits.clone()  # (R, V)
    for row, history in zip(out, histories):
        if history.numel():
            seen = row[history]
            row[history] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return out


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension (..., V) -> (...), the first of equal maxima (a NaN counts as the maximum):
    through numpy for float32 logits on the CPU: over a 262,144-token vocabulary, as a decode step hands them over,
    about 0.2 ms against torch's 0.6 (3% of a 270M model's step)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(numpy.asarray(logits.detach().numpy().argmax(-1)))
    return logits.argmax(-1)


def history_tensor(tokens: list[int], params: SamplingParams, device: torch.device | str) -> torch.Tensor:
    """The token ids the repetition penalty looks at: the newest repeat_last_n of `tokens` (empty when it is off, to
    skip building the tensor)."""
    return torch.tensor(params.recent(tokens), dtype=torch.long, device=device)


def next_token(logits: torch.Tensor, params: SamplingParams, history: torch.Tensor, generator: torch.Generator) -> int:
    """Choose one token from logits (V,) of the last position."""
    logits = apply_repetition_penalty(logits, history, params.penalty)
    if params.greedy:
        return int(greedy_ids(logits))
    found = _top_k(logits.float(), params.top_k)
    if found is not None:  # sample among the k candidates: the same distribution as warp's, without its V-wide work
        values, index = found
        probs = _warp_sorted(values, params).softmax(-1)  # (k,)
        return int(index[int(torch.multinomial(probs, 1, generator=generator))])
    probs = warp(logits, params).softmax(-1)  # (V,)
    return int(torch.multinomial(probs, 1, generator=generator))
