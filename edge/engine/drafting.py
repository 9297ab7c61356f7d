"""What `Engine.use_drafter` builds a drafter from: the draft length, a separate draft model's options (each one left
out is the load spec's) and the length of its own cache."""

from __future__ import annotations

from edge.decoding.speculative import DraftLength
from edge.errors import SamplingError
from edge.load_spec import DraftModelOptions


def draft_length(value: int | str | DraftLength) -> DraftLength:
    """A DraftLength from "adaptive", "adaptive:P" or a whole number (one given as a DraftLength is kept)."""
    return value if isinstance(value, DraftLength) else DraftLength.parse(value)


def draft_options(loaded: DraftModelOptions, context: int | None, weights: str | None, kv_cache: str | None
                  ) -> DraftModelOptions:
    """The draft model's options: each one given, else the loaded one."""
    return DraftModelOptions(context if context is not None else loaded.context, weights or loaded.weights,
                             kv_cache or loaded.kv_cache)


def draft_context(requested: int | None, length: DraftLength, max_context: int) -> int:
    """The draft model's cache length: the one requested (at most the engine's context), else the engine's."""
    if requested is None:
        return max_context
    least = 2 * (length.longest + 1)  # a window restart keeps half, and a draft must fit after it
    if not isinstance(requested, int) or not least <= requested:
        raise SamplingError(f"draft context must be a whole number of at least {least} tokens (twice the longest "
                            f"draft plus one), got {requested!r}")
    return min(requested, max_context)
