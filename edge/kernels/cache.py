"""edge's cache folder: $EDGE_CACHE_DIR, else the platform's user cache folder (~/.cache/edge on Linux).

Compiled kernels, auto-exported bundles, converted GGUF checkpoints and the benchmarks' llama.cpp files live in
folders under it. It sits at the bottom of the import graph, so every package finds it here.
"""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_folder(name: str = "") -> Path:
    """The folder `name` under edge's cache (the cache itself for "")."""
    root = os.environ.get("EDGE_CACHE_DIR")
    return (Path(root) if root else Path(user_cache_dir("edge", appauthor=False))) / name
