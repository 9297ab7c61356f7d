"""What the user can change while chatting, checked before it is applied."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from edge.decoding.registry import DrafterSpec
from edge.decoding.sampling import OPTIONS, SamplingParams, label
from edge.engine import GenerationOptions
from edge.errors import MemoryBudgetError, SamplingError
from edge.load_spec import LoadSpec
from edge.decoding.speculative import DraftLength
from edge.memory.budget import BudgetError, parse_size

DRAFTER_CHOICES = (  # names short enough to show whole in the settings' drafter field at 80 columns
    ("n-gram lookup, then feature drafter", "hybrid:feature"),
    ("feature drafter (model's own states)", "feature"),
    ("n-gram lookup, then built-in drafter", "hybrid:builtin"),
    ("built-in drafter model", "builtin"),
    ("retrieval (own replies) + prompt lookup", "retrieval"),
    ("n-gram prompt lookup", "ngram"),
    ("early exit (self-speculative)", "early-exit"),
    ("adaptive layer skip (self-speculative)", "adaptive"),
    ("off (plain decoding)", "none"),
)


CHAT_MAX_NEW_TOKENS = 512  # edge-chat's default reply length (its --max-new-tokens)
# the generation options the settings form edits; stop strings stay as the command line set them
FORM_OPTIONS = tuple(name for name, limits in OPTIONS.items() if limits.kind is not str)


@dataclass(frozen=True)
class ChatSettings:
    drafter: str = "none"  # a drafter spec (edge/decoding/registry.py) or "none"
    draft_length: str = "adaptive"  # "adaptive", "adaptive:P" or a whole number
    # the generation options every front shares (max_new_tokens, temperature, ..., stop), checked when made
    options: SamplingParams = SamplingParams(max_new_tokens=CHAT_MAX_NEW_TOKENS)
    memory_budget: str = ""  # e.g. "6GiB"; "" means the device's free memory
    system_prompt: str = ""

    @classmethod
    def from_spec(cls, spec: LoadSpec, options: GenerationOptions, *, system_prompt: str = "") -> "ChatSettings":
        """The settings a chat starts with: the load spec's drafter and draft length, and these generation options."""
        return cls(drafter=str(spec.drafter) if spec.drafter is not None else "none",
                   draft_length=spec.draft_length, options=options.sampling, system_prompt=system_prompt).check()

    def applied_to(self, spec: LoadSpec) -> LoadSpec:
        """`spec` with these settings' drafter and draft length."""
        return spec.replace(drafter=DrafterSpec.parse(self.drafter), draft_length=self.draft_length)

    def generation_options(self) -> GenerationOptions:
        return GenerationOptions(**self.options.options(), speculate=self.drafter != "none")

    @property
    def budget_bytes(self) -> int | None:
        """The memory budget in bytes (None: none set), or a MemoryBudgetError naming what cannot be read."""
        try:
            return parse_size(self.memory_budget) if self.memory_budget.strip() else None
        except BudgetError as error:
            raise MemoryBudgetError(str(error)) from None

    def replace(self, **changes) -> "ChatSettings":
        """These settings with `changes`; a generation option (max_new_tokens=..., temperature=...) by its name."""
        shared = {name: changes.pop(name) for name in OPTIONS if name in changes}
        if shared:
            changes["options"] = dataclasses.replace(changes.get("options", self.options), **shared)
        return dataclasses.replace(self, **changes)

    def check(self) -> "ChatSettings":
        """Return self if every value is usable; raise an EdgeError naming the field and the fix (the generation
        options were checked when made)."""
        DrafterSpec.parse(self.drafter)  # the forms edge-chat --drafter takes
        DraftLength.parse(self.draft_length)  # the forms edge-chat --draft-length takes
        self.budget_bytes  # noqa: B018 - raises MemoryBudgetError when the text cannot be read
        return self


def repetition_guard(options: SamplingParams) -> str:
    """The repetition guard in force, in words: the penalty (set, or the default the temperature gives) over how many
    tokens, and the loop stop."""
    penalty = options.penalty
    if penalty == 1.0 or options.repeat_last_n == 0:
        parts = ["no repetition penalty"]
    else:
        source = "" if options.repetition_penalty is not None else ", sampling's default"
        window = "the whole context" if options.repeat_last_n < 0 else f"the last {options.repeat_last_n} tokens"
        parts = [f"penalty {penalty:g} over {window}{source}"]
    parts.append(f"loop stop after {options.loop_stop} tokens" if options.loop_stop else "loop stop off")
    return "repetition guard: " + "; ".join(parts)


def form_value(name: str, text: str) -> int | float | None:
    """A generation option's form field as its value, or a one-line SamplingError naming the field as the form labels
    it (top-p), its limits and the text; empty is none for an option that takes none (seed)."""
    limits = OPTIONS[name]
    if limits.optional and not text.strip():
        return None
    value = parse_number(text, label(name), limits.kind)
    limits.check(value, label(name))
    return value


def form_text(value: int | float | None) -> str:
    """A generation option's value as the form shows it (none: empty), short where that keeps it exactly (1, not 1.0)."""
    if value is None or isinstance(value, int):
        return "" if value is None else str(value)
    return f"{value:g}" if float(f"{value:g}") == value else repr(value)


def parse_number(text: str, name: str, kind: type = float):
    """A form field as a number, or a one-line error naming the field."""
    try:
        return kind(text.strip())
    except ValueError:
        expected = "a whole number" if kind is int else "a number"
        raise SamplingError(f"{name} must be {expected}, got {text!r}") from None


__all__ = ["CHAT_MAX_NEW_TOKENS", "ChatSettings", "DRAFTER_CHOICES", "FORM_OPTIONS", "form_text", "form_value",
           "parse_number", "repetition_guard"]
