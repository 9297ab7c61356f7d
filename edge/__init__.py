"""edge: on-device LLM inference with lossless speculative decoding.

The stable embedding surface is re-exported here: `Engine`, `Event`, `Stats`, `GenerationOptions` and the errors.
"""

from edge.engine import Engine, GenerationOptions
from edge.errors import (
    CheckpointError,
    EdgeError,
    PromptError,
    SamplingError,
    TokenizerError,
    UnsupportedModelError,
)
from edge.events import Event, Stats

__version__ = "0.1.0"
__all__ = [
    "Engine",
    "GenerationOptions",
    "Event",
    "Stats",
    "EdgeError",
    "CheckpointError",
    "PromptError",
    "SamplingError",
    "TokenizerError",
    "UnsupportedModelError",
]
