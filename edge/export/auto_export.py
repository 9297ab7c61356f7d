"""Run a checkpoint folder on ONNX Runtime without an explicit export: export it once into the cache, then reuse it.

    path = cached_bundle("path/to/checkpoint", draft=Path("path/to/draft"), weights="int8")   # exports on first use

The runtime reaches this through the "edge.exporters" entry point (pyproject.toml), so edge never imports the
exporter: `Engine.load(folder, backend="onnx")` calls it. The cache folder is $EDGE_CACHE_DIR/bundles (default: the
user cache folder, ~/.cache/edge/bundles). A bundle's name hashes the checkpoint's files, the weight format and
edge's version (and the draft checkpoint's files when it carries one), so a changed checkpoint exports afresh;
without a draft model, any cached bundle of the checkpoint serves.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


import edge
from edge.backends.bundle import is_bundle, read_bundle, sha256_file
from edge.errors import BundleError
from edge.export import bundle as exporter
from edge.export.quantize import QuantSettings
from edge.kernels.cache import cache_folder

DEFAULT_WEIGHTS = "int8"


def cache_dir() -> Path:
    return cache_folder("bundles")


def _fingerprint(folder: Path) -> list[str]:
    return [f"{p.name}:{sha256_file(p)}" for p in sorted(folder.iterdir()) if p.is_file()]


def _current(folder: Path) -> bool:
    """A finished bundle whose manifest this edge reads (one from an older edge-export, unsealed, is exported
    again)."""
    if not is_bundle(folder):
        return False
    try:
        read_bundle(folder, verify=False)
    except BundleError:
        return False
    return True


def cached_bundle(checkpoint: str | Path, *, draft: Path | None = None, weights: str = DEFAULT_WEIGHTS,
                  progress: bool = False) -> Path:
    """The bundle of `checkpoint` (carrying the draft checkpoint `draft` when given) in the cache; exported now if
    it is not there yet."""
    checkpoint = Path(checkpoint)

    def digest(parts: list[str]) -> str:
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]

    base = f"{checkpoint.name}-{weights}-{digest([edge.__version__, weights, *_fingerprint(checkpoint)])}"
    bundle = cache_dir() / (f"{base}-{digest(_fingerprint(draft))}" if draft else base)
    if _current(bundle):
        return bundle
    if draft is None:  # any cached bundle of this checkpoint serves: a drafter it carries is simply not used
        for candidate in sorted(cache_dir().glob(f"{base}*")):
            if _current(candidate):
                return candidate
    bundle.parent.mkdir(parents=True, exist_ok=True)
    options = exporter.ExportOptions(quant=QuantSettings(weights), drafter=str(draft) if draft else None,
                                     overwrite=bundle.exists())
    exporter.export_bundle(checkpoint, bundle, options, show_progress=progress)
    return bundle
