"""A short text that calibrations run the model over once: chat, code, prose and a translation, as edge's prompts mix
them (layer-skip sets: edge/decoding/drafters/skip_calibration.py; key scales: edge/model/key_scales.py), and that pass.

    cache = calibration_pass(model, tokenizer.encode(CALIBRATION_TEXT))   # the keys/values it wrote; hooks see layers
"""

from __future__ import annotations

import torch

from edge.model.kv_cache import KVCache
from edge.model.transformer import Transformer

CALIBRATION_TEXT = (
    "User: How do I read a CSV file in Python?\n"
    "Assistant: Use the csv module: open the file with open('data.csv', newline='') and pass it to csv.reader, "
    "which yields each row as a list of strings.\n"
    "def mean(values):\n    return sum(values) / len(values)\n"
    "The river rises in the mountains and flows east for three hundred miles before it reaches the sea. "
    "Translate to French: The weather is nice today. Le temps est beau aujourd'hui."
)


def calibration_pass(model: Transformer, token_ids: list[int]) -> KVCache:
    """One pass of every layer over `token_ids`, as a batch of two so that it runs module by module (forward hooks on
    the layers see each one; the fused step is batch 1 only); returns the cache it wrote (keys after RoPE)."""
    cache = KVCache.for_model(model.config, len(token_ids), dtype=model.dtype, device=model.device, batch=2)
    tokens = torch.tensor([token_ids, token_ids], device=model.device)  # (2, T)
    with torch.no_grad():
        model(tokens, 0, cache)
    return cache
