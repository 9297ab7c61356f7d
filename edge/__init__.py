"""edge: on-device LLM inference with lossless speculative decoding.

The stable embedding surface is re-exported here: `Engine`, `LoadSpec`, `Event`, `Stats`, `GenerationOptions` and the errors.
"""

from edge.engine import Engine, GenerationOptions
from edge.errors import (
    CheckpointError,
    EdgeError,
    EngineBusyError,
    MemoryBudgetError,
    PromptError,
    SamplingError,
    TokenizerError,
    UnsupportedModelError,
)
from edge.events import Event, Stats
from edge.load_spec import LoadSpec

__version__ = "0.1.0"
__all__ = [
    "Engine",
    "LoadSpec",
    "GenerationOptions",
    "Event",
    "Stats",
    "EdgeError",
    "EngineBusyError",
    "CheckpointError",
    "MemoryBudgetError",
    "PromptError",
    "SamplingError",
    "TokenizerError",
    "UnsupportedModelError",
]
