"""Which checkpoint a peer runtime (transformers, llama.cpp) loads for the model edge-bench was given."""

from __future__ import annotations


def source_checkpoint(model: str) -> str:
    """A peer runs a bundle's source checkpoint (it cannot read edge's graphs): the same weights, unquantized."""
    from edge.backends.bundle import is_bundle, read_bundle  # importing edge loads the runtime: only when a peer is run

    return read_bundle(model, verify=False).manifest["source"]["path"] if is_bundle(model) else model
