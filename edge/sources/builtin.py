"""Where the built-in models live inside the package: the 10M demonstration target (run when the default model is not
installed, and the fixture of the tests and benchmarks), its drafters, and what ships for real models: retrieval
datastores (edge/models/*-replies), packed feature drafters (edge/models/*-feature) and draft vocabularies
(edge/models/*-vocab), each found by its card's tokenizer vocabulary hash."""

from __future__ import annotations

import json
from pathlib import Path

BUILTIN_DIR = Path(__file__).parent.parent / "models" / "default"  # edge/models/, beside the subpackages


def builtin_model_path() -> Path | None:
    """The built-in checkpoint folder, or None when this installation has none."""
    return BUILTIN_DIR if (BUILTIN_DIR / "config.json").is_file() else None


def builtin_drafter_path() -> Path | None:
    """The built-in draft checkpoint (same tokenizer as the built-in model), or None."""
    folder = BUILTIN_DIR.parent / "drafter"
    return folder if (folder / "config.json").is_file() else None


def builtin_feature_drafter_path() -> Path | None:
    """The built-in feature drafter (trained on the built-in model's hidden states), or None."""
    folder = BUILTIN_DIR.parent / "feature"
    return folder if (folder / "config.json").is_file() else None


def builtin_deep_feature_drafter_path() -> Path | None:
    """The built-in feature drafter grown to two layers: more accurate, dearer per drafted token; it pays where a
    target step reads far more weights than the drafter does (the benchmarks' memory-bound copies of the built-in
    model), or None."""
    folder = BUILTIN_DIR.parent / "feature-deep"
    return folder if (folder / "config.json").is_file() else None


def shipped_feature_drafters() -> list[Path]:
    """Feature drafters packed for real models (edge/models/*-feature: python -m train.pack_feature_drafter)."""
    return sorted(folder for folder in BUILTIN_DIR.parent.glob("*-feature") if (folder / "card.json").is_file())


def shipped_for(tokenizer, folders: list[Path]) -> Path | None:
    """The first of `folders` whose card.json names `tokenizer`'s vocabulary (its "vocab_sha256"), or None: what
    ships for the model at hand."""
    vocab = tokenizer.fingerprint()["vocab_sha256"]
    for folder in folders:
        try:
            if json.loads((folder / "card.json").read_text()).get("vocab_sha256") == vocab:
                return folder
        except (OSError, ValueError, AttributeError):
            continue
    return None


def shipped_vocabularies() -> list[Path]:
    """Draft vocabularies for real model families (edge/models/*-vocab: the token ids a family's models write, to
    which a draft model's head is trimmed; python -m edge.export.vocab_trim)."""
    return sorted(folder for folder in BUILTIN_DIR.parent.glob("*-vocab") if (folder / "card.json").is_file())


def shipped_datastores() -> list[Path]:
    """The retrieval datastore folders in the package (edge/models/*-replies: python -m train.datastore)."""
    return sorted(folder for folder in BUILTIN_DIR.parent.glob("*-replies") if (folder / "card.json").is_file())
