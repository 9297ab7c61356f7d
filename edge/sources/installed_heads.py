"""EAGLE-3 heads built on this machine for a GGUF model, found again by the model's identity.

    python -m train.eagle3 --target MODEL.gguf ... --install   # trains, then copies OUT/final here
    installed_head("MODEL-Q8_0.gguf")                          # the head's folder, for any quantization of MODEL

    heads_root()/IDENTITY/   config.json, model.safetensors, card.json: the head in the Hub's layout (eagle3:FOLDER)

A model's identity is a hash of its final norm's stored values, its architecture and its vocabulary size. llama.cpp's
quantizer copies float32 norms unchanged, so every quantization of one model shares it, while another model (or
another fine-tune of the same shape) does not. The head stays exact on any file, as every drafter does (the target
verifies each token); the identity only decides where it is offered by default.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from edge.sources.data_dir import default_data_dir

NORM = "output_norm.weight"  # the final norm, float32 in every GGUF quantization


def heads_root() -> Path:
    """Where installed heads live: edge's data folder's heads/ ($EDGE_DATA_DIR, else the platform's)."""
    return default_data_dir() / "heads"


def identity(path: str | Path) -> str | None:
    """The identity of the GGUF model at `path` (16 hex digits), or None where it is not a GGUF file edge reads. Its
    settings are read once into edge's cache (what loading it reads next), then only the norm's bytes."""
    path = Path(path)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        return None
    from edge.errors import EdgeError
    from edge.sources.gguf_checkpoint import INDEX_FILE, checkpoint_from_gguf

    try:
        folder = checkpoint_from_gguf(path)
        config = json.loads((folder / "config.json").read_text())
        entry = next(e for e in json.loads((folder / INDEX_FILE).read_text())["tensors"] if e["gguf"] == NORM)
        with open(path, "rb") as file:
            file.seek(entry["offset"])
            values = file.read(entry["bytes"])
    except (EdgeError, OSError, ValueError, KeyError, StopIteration):
        return None
    digest = hashlib.sha256(f"{config.get('architectures')}\0{config.get('vocab_size')}\0{entry['type']}\0".encode())
    digest.update(values)
    return digest.hexdigest()[:16]


def installed_head(model: str | Path) -> Path | None:
    """The folder of the head installed for the model at `model`, or None (none installed, or not a GGUF file)."""
    root = heads_root()
    if not root.is_dir() or not any(root.iterdir()):  # nothing installed: the file is not read
        return None
    key = identity(model)
    folder = root / key if key is not None else None
    return folder if folder is not None and (folder / "config.json").is_file() else None


def install_head(head: Path, model: str | Path) -> Path:
    """Copy the head folder `head` (config.json, weights, card) to where `installed_head(model)` finds it; returns
    the new folder. Raises ValueError when `model` is not a GGUF file with a final norm."""
    key = identity(model)
    if key is None:
        raise ValueError(f"{model} is not a GGUF file with a final norm ({NORM}); heads are installed for GGUF models")
    target = heads_root() / key
    partial = target.with_name(f".{key}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(head, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)  # whole or absent
    return target
