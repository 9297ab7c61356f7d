"""edge: on-device LLM inference with lossless speculative decoding.

The stable embedding surface is re-exported here: `Engine`, `LoadSpec`, `Event`, `Stats`, `GenerationOptions` and the errors.
They load on first use, so importing one part (edge.kernels, edge.memory) does not load the whole runtime.
"""

from importlib import import_module

_HOMES = {"Engine": "edge.engine", "GenerationOptions": "edge.engine", "LoadSpec": "edge.load_spec",
          "Event": "edge.events", "Stats": "edge.events"}

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


def __getattr__(name: str):
    if name in __all__:
        value = getattr(import_module(_HOMES.get(name, "edge.errors")), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'edge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
