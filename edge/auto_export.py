"""Run a checkpoint folder on ONNX Runtime without an explicit export: export it once into the cache, then reuse it.

    path = cached_bundle("path/to/checkpoint", drafter="builtin", weights="int8")   # exports on first use

The cache folder is $EDGE_CACHE_DIR/bundles (default: the user cache folder, ~/.cache/edge/bundles). A bundle's
name hashes the checkpoint's files, the weight format and edge's version (and the drafter's files when it carries
one), so a changed checkpoint exports afresh; without a draft model, any cached bundle of the checkpoint serves. The exporter needs the `export` extra (pip install 'edge[export]').
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from edge.bundle import is_bundle, sha256_file
from edge.errors import BundleError

DEFAULT_WEIGHTS = "int8"


def cache_dir() -> Path:
    root = os.environ.get("EDGE_CACHE_DIR")
    if root:
        return Path(root) / "bundles"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("edge", appauthor=False)) / "bundles"


def _fingerprint(folder: Path) -> list[str]:
    return [f"{p.name}:{sha256_file(p)}" for p in sorted(folder.iterdir()) if p.is_file()]


def cached_bundle(checkpoint: str | Path, *, drafter: str | None = None, weights: str = DEFAULT_WEIGHTS,
                  progress: bool = False) -> Path:
    """The bundle of `checkpoint` (with `drafter`'s model when it is a draft checkpoint) in the cache; exported now
    if it is not there yet."""
    import edge
    from edge.planning import drafter_folder, drafter_kind

    checkpoint = Path(checkpoint)
    draft = drafter_folder(drafter) if drafter and drafter_kind(drafter) == "model" else None

    def digest(parts: list[str]) -> str:
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]

    base = f"{checkpoint.name}-{weights}-{digest([edge.__version__, weights, *_fingerprint(checkpoint)])}"
    bundle = cache_dir() / (f"{base}-{digest(_fingerprint(draft))}" if draft else base)
    if is_bundle(bundle):
        return bundle
    if draft is None:  # any cached bundle of this checkpoint serves: a drafter it carries is simply not used
        for candidate in sorted(cache_dir().glob(f"{base}*")):
            if is_bundle(candidate):
                return candidate
    try:
        from export.bundle import ExportOptions, export_bundle
        from export.quantize import QuantSettings
    except ImportError as error:
        raise BundleError(f"running a checkpoint on ONNX Runtime exports it first, which needs {error.name}: "
                          "pip install 'edge[export]', or export it yourself with edge-export") from None
    bundle.parent.mkdir(parents=True, exist_ok=True)
    options = ExportOptions(quant=QuantSettings(weights), drafter=str(draft) if draft else None,
                            overwrite=bundle.exists())
    export_bundle(checkpoint, bundle, options, show_progress=progress)
    return bundle
