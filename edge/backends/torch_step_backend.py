"""The TorchScript / torch.export backend: a saved `KVStep` (edge/export/torch_targets.py) behind the Transformer calls.

    model = TorchStepModel(path, config)          # target/model.ts (TorchScript) or target/model.pt2 (torch.export)
    out = model(tokens, start, cache)             # the calls of edge/backends/exported_model.py

The step takes the cache's valid prefix (L, Hkv, start, Dh) as a view of edge's KVCache and returns the new rows,
which are written here. Loading a TorchScript or .pt2 file runs code from it: load only bundles you made.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from edge.model.config import ModelConfig
from edge.backends.exported_model import ExportedModel
from edge.model.kv_cache import KVCache


class TorchStepModel(ExportedModel):
    def __init__(self, path: str | Path, config: ModelConfig, *, vocab_map: torch.Tensor | None = None) -> None:
        super().__init__(path, config, vocab_map)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates torch.jit.load
            if self.path.suffix == ".pt2":
                self.step = torch.export.load(str(path)).module()
            else:
                self.step = torch.jit.load(str(path), map_location="cpu")

    def _step(self, tokens: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        end = start + tokens.shape[0]
        with torch.inference_mode():
            logits, keys, values = self.step(tokens, cache.keys[:, 0, :, :start], cache.values[:, 0, :, :start])
        cache.keys[:, 0, :, start:end] = keys  # (L, Hkv, T, Dh)
        cache.values[:, 0, :, start:end] = values
        return logits  # (T, V')
