"""Errors edge raises on bad input.

Every error is one line that names the problem and how to fix it; callers (the CLIs, a desktop app) can show
`str(error)` as is. Each class also derives from the built-in exception a Python user would expect.
"""

from __future__ import annotations


class EdgeError(Exception):
    """Base class: a one-line message naming the problem and the fix."""


class UnsupportedModelError(EdgeError, ValueError):
    """The checkpoint's architecture or one of its settings is not implemented."""


class CheckpointError(EdgeError, OSError):
    """A checkpoint file is missing, truncated, corrupt or in a refused format (pickle)."""


class TokenizerError(EdgeError, ValueError):
    """The tokenizer files are missing or invalid, or a chat template failed to render."""


class PromptError(EdgeError, ValueError):
    """The prompt is empty or does not fit the context."""


class ContextLengthError(PromptError):
    """The prompt (with the room its reply needs) is longer than the context."""


class SamplingError(EdgeError, ValueError):
    """A sampling parameter is out of range."""


class EngineBusyError(EdgeError, RuntimeError):
    """An engine was asked for a second generation while one is still running (one engine, one reply at a time)."""


class MemoryBudgetError(EdgeError, ValueError):
    """A memory budget that cannot be read, or that cannot hold the model (edge.memory.budget.BudgetError's message, raised
    where edge plans)."""


class SettingError(EdgeError, ValueError):
    """An environment setting asks for what this machine cannot do (EDGE_CPU_KERNEL naming a path its CPU lacks)."""


class BundleError(CheckpointError):
    """An exported bundle is incomplete, tampered with, truncated, or from a newer format version."""
