"""What the user can change while chatting, checked before it is applied."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from edge.decoding.registry import DrafterSpec
from edge.engine import GenerationOptions
from edge.errors import MemoryBudgetError, SamplingError
from edge.load_spec import LoadSpec
from edge.decoding.speculative import DraftLength
from edge.memory.budget import BudgetError, parse_size

DRAFTER_CHOICES = (
    ("n-gram lookup, then the feature drafter", "hybrid:feature"),
    ("feature drafter (on the model's own states)", "feature"),
    ("n-gram lookup, then the built-in drafter", "hybrid:builtin"),
    ("built-in drafter model", "builtin"),
    ("retrieval (the model's own replies) and prompt lookup", "retrieval"),
    ("n-gram prompt lookup", "ngram"),
    ("early exit (self-speculative)", "early-exit"),
    ("adaptive layer skip (self-speculative)", "adaptive"),
    ("off (plain decoding)", "none"),
)


@dataclass(frozen=True)
class ChatSettings:
    drafter: str = "none"  # a drafter spec (edge/decoding/registry.py) or "none"
    draft_length: str = "adaptive"  # "adaptive", "adaptive:P" or a whole number
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    memory_budget: str = ""  # e.g. "6GiB"; "" means the device's free memory
    system_prompt: str = ""
    # sampling options set on the command line (kept as they are by the settings screen)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: LoadSpec, options: GenerationOptions, *, system_prompt: str = "") -> "ChatSettings":
        """The settings a chat starts with: the load spec's drafter and draft length, and these sampling options."""
        return cls(drafter=str(spec.drafter) if spec.drafter is not None else "none",
                   draft_length=spec.draft_length, temperature=options.temperature, top_p=options.top_p,
                   max_tokens=options.max_new_tokens, system_prompt=system_prompt, top_k=options.top_k,
                   min_p=options.min_p, repetition_penalty=options.repetition_penalty, seed=options.seed,
                   stop=options.stop).check()

    def applied_to(self, spec: LoadSpec) -> LoadSpec:
        """`spec` with these settings' drafter and draft length."""
        return spec.replace(drafter=DrafterSpec.parse(self.drafter), draft_length=self.draft_length)

    def generation_options(self) -> GenerationOptions:
        return GenerationOptions(max_new_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                                 top_k=self.top_k, min_p=self.min_p, repetition_penalty=self.repetition_penalty,
                                 seed=self.seed, stop=self.stop, speculate=self.drafter != "none")

    @property
    def budget_bytes(self) -> int | None:
        """The memory budget in bytes (None: none set), or a MemoryBudgetError naming what cannot be read."""
        try:
            return parse_size(self.memory_budget) if self.memory_budget.strip() else None
        except BudgetError as error:
            raise MemoryBudgetError(str(error)) from None

    def replace(self, **changes) -> "ChatSettings":
        return dataclasses.replace(self, **changes)

    def check(self) -> "ChatSettings":
        """Return self if every value is usable; raise an EdgeError naming the field and the fix."""
        DrafterSpec.parse(self.drafter)  # the forms edge-chat --drafter takes
        DraftLength.parse(self.draft_length)  # the forms edge-chat --draft-length takes
        if not 0.0 <= self.temperature <= 5.0:
            raise SamplingError(f"temperature must be between 0 and 5 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingError(f"top-p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.max_tokens < 1:
            raise SamplingError(f"max tokens must be at least 1, got {self.max_tokens}")
        self.budget_bytes  # noqa: B018 - raises MemoryBudgetError when the text cannot be read
        return self


def parse_number(text: str, name: str, kind: type = float):
    """A form field as a number, or a one-line error naming the field."""
    try:
        return kind(text.strip())
    except ValueError:
        expected = "a whole number" if kind is int else "a number"
        raise SamplingError(f"{name} must be {expected}, got {text!r}") from None


__all__ = ["ChatSettings", "DRAFTER_CHOICES", "parse_number"]
