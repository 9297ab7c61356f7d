"""A model's recommended sampling, where its files carry one: generation_config.json's, or a GGUF file's
`general.sampling.*` metadata (llama.cpp writes those from generation_config.json; a GGUF file read into a checkpoint
folder gets them back as its generation_config.json: edge/sources/gguf_checkpoint.py).

    recommended_sampling(folder)   ->  {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}

The names are edge's generation options (edge/decoding/sampling.py). generation_config.json's `do_sample: false` is
transformers' own default, written by tools without intent, and its sampling values are then unused by transformers
too: such a file recommends nothing. Values of the wrong type or out of range are left out (the option's default
stays), never an error: the file is the model's, not the user's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# a GGUF file's metadata key -> generation_config.json's key (llama.cpp's names, general.sampling.*)
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
             "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
             "general.sampling.penalty_repeat": "repetition_penalty",
             "general.sampling.penalty_last_n": "repeat_last_n"}
# the options a model may recommend: generation_config.json's keys, which are edge's option names
RECOMMENDABLE = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "repeat_last_n")
# what each recommended value must be to be taken (the options' own limits, edge/decoding/sampling.py)
ACCEPTED = {"temperature": (float, 0.0, 2.0), "top_k": (int, 0, None), "top_p": (float, 1e-9, 1.0),
            "min_p": (float, 0.0, 1.0), "repetition_penalty": (float, 0.01, 100.0), "repeat_last_n": (int, -1, None)}


def recommended_sampling(folder: str | Path) -> dict:
    """The sampling options the model in `folder` recommends (generation_config.json), by edge's names; {} for none."""
    try:
        data = json.loads((Path(folder) / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("do_sample") is False:
        return {}
    # repeat_last_n: only from a GGUF file's metadata (the key is edge's; transformers has none)
    return {name: data[name] for name in RECOMMENDABLE if name in data and _accepted(name, data[name])}


def gguf_generation_config(metadata: dict) -> dict | None:
    """generation_config.json's sampling values from a GGUF file's `general.sampling.*` metadata; None for none."""
    found = {key: metadata[name] for name, key in GGUF_KEYS.items()
             if name in metadata and _accepted(key, metadata[name])}
    if not found:
        return None
    for key, value in found.items():  # float32 in the file: 0.95 reads 0.949999988079071
        found[key] = value if isinstance(value, int) else float(f"{value:.6g}")
    return {"do_sample": True, **found}


def _accepted(option: str, value: object) -> bool:
    kind, low, high = ACCEPTED[option]
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        return False
    return math.isfinite(value) and value >= low and (high is None or value <= high)
