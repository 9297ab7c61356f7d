"""GenerationOptions: the options of one reply, checked when made: the ones every front shares (length, sampling,
stop strings; SamplingParams in edge/decoding/sampling.py declares them with their limits) and the engine's own
(speculation, the task label, a stop callback, the response format). `Engine.generate` and `Engine.chat` take one,
with its fields as keywords overriding it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from edge.decoding.sampling import SamplingParams, asked_over
from edge.errors import SamplingError


@dataclass(frozen=True)
class GenerationOptions(SamplingParams):
    ignore_eos: bool = False  # keep going past end-of-sequence tokens and loops (benchmarks)
    speculate: bool = True  # use the engine's drafter, if it has one (False: plain decoding)
    task: str | None = None  # a label such as "code" or "chat": adaptive drafters remember choices per task
    should_stop: Callable[[], bool] | None = None  # checked after every step; True ends generation ("stopped")
    # OpenAI's response_format: {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}};
    # the output then follows it by construction (edge/decoding/constrained.py)
    response_format: dict | None = None

    @classmethod
    def merged(cls, options: "GenerationOptions | None", overrides: dict,
               recommended: dict | None = None) -> "GenerationOptions":
        """`options` (default: the defaults, with a model's `recommended` sampling over them) with `overrides` (field
        names as keywords) applied, checked; greedy asked for in `overrides` (temperature=0) without a repetition
        penalty takes none (sampling.asked_over)."""
        if options is None:
            options = cls.from_kwargs(dict(recommended or {}))
        if not isinstance(options, GenerationOptions):
            raise SamplingError(f"options must be a GenerationOptions, got {type(options).__name__}; pass fields such "
                                "as max_new_tokens=... as keywords")
        fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(cls)}
        return cls.from_kwargs(asked_over(fields, overrides))

    @classmethod
    def from_kwargs(cls, options: dict) -> "GenerationOptions":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise SamplingError(f"unknown generation option {unknown[0]!r}; valid options: {', '.join(sorted(names))}")
        if isinstance(options.get("stop"), str):
            options = {**options, "stop": (options["stop"],)}
        if isinstance(options.get("stop"), list):
            options = {**options, "stop": tuple(options["stop"])}
        return cls(**options)

    def check(self) -> None:
        """Raise SamplingError (one line) for an option of the wrong type or out of range."""
        super().check()  # the shared options, against their limits

        def require(condition: bool, message: str) -> None:
            if not condition:
                raise SamplingError(message)
        for name in ("ignore_eos", "speculate"):
            require(isinstance(getattr(self, name), bool), f"{name} must be True or False, got {getattr(self, name)!r}")
        require(self.task is None or isinstance(self.task, str), f"task must be a label (text), got {self.task!r}")
        require(self.should_stop is None or callable(self.should_stop),
                f"should_stop must be a function returning True to stop, got {self.should_stop!r}")
        require(self.response_format is None or isinstance(self.response_format, dict),
                'response_format must be a dict such as {"type": "json_object"}, got ' + repr(self.response_format))

    @property
    def sampling(self) -> SamplingParams:
        """The shared options alone, as decoding takes them."""
        return SamplingParams(**self.options())
