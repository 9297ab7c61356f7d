"""The engine: `Engine` loads a model once and streams replies; `GenerationOptions` is one reply's options."""

from edge.engine.engine import Engine
from edge.engine.options import GenerationOptions

__all__ = ["Engine", "GenerationOptions"]
