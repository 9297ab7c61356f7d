"""What every exported backend shares: the `Transformer` calls the engine and drafters make, over a step function
that takes the cache's valid prefix and returns the logits and the new keys/values.

    model(tokens, start, cache)   tokens (1, T) at [start, start + T) -> handle (1, T, V'); writes the cache
    model.logits(handle)          (1, T, V): a trimmed head's logits put back in the full vocabulary
    model.new_cache(max_len)      the cache this backend reads

Backends: edge.backends.onnx_backend.OnnxModel (ONNX Runtime), edge.backends.torch_step_backend.TorchStepModel
(TorchScript and torch.export programs). There are no hidden states on these backends: a forward returns the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from edge.model.config import ModelConfig
from edge.model.trimmed_head import expand_vocabulary
from edge.errors import UnsupportedModelError
from edge.model.kv_cache import KVCache


class ExportedModel:
    runner = None  # edge's CPU kernel runner (edge/kernels/runner.py) belongs to the eager model
    dtype = torch.float32  # activations and KV cache (weights may be quantized inside the graph)
    device = torch.device("cpu")

    def __init__(self, path: str | Path, config: ModelConfig, vocab_map: torch.Tensor | None = None) -> None:
        self.path = Path(path)
        self.config = config
        self.vocab_map = vocab_map  # (V',) full-vocabulary id of each kept head row, or None for a full head

    def weight_bytes(self) -> int:
        return self.path.stat().st_size

    def new_cache(self, max_len: int) -> KVCache:
        return KVCache.for_model(self.config, max_len, dtype=torch.float32)  # (L, 1, Hkv, S, Dh)

    def __call__(self, tokens: torch.Tensor, start: int, cache: KVCache,
                 layers: Iterable[int] | None = None) -> torch.Tensor:
        """tokens (1, T) at positions [start, start + T) -> logits (1, T, V'); writes the cache, like Transformer."""
        if layers is not None:
            raise UnsupportedModelError("layer-skip and early-exit drafters need the torch backend; with an exported "
                                        "bundle use its drafter, ngram, or load the checkpoint folder instead")
        if start > cache.length:
            raise ValueError(f"a forward at position {start} would leave a gap after cache length {cache.length}")
        end = start + tokens.shape[1]
        if end > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} positions; writing up to {end} does not fit")
        logits = self._step(tokens[0], start, cache)  # (T, V')
        cache.length = end
        return logits[None]

    def _step(self, tokens: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        """Run tokens (T,) at [start, start + T) over cache slots [0, start); write their keys/values; logits."""
        raise NotImplementedError

    def forward_logits(self, tokens: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        """logits(self(tokens, start, cache)): the interface edge's own model has for a decode step."""
        return self.logits(self(tokens, start, cache))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """The forward's logits (B, T, V') -> (B, T, V); rows a trimmed head dropped are -inf (never drafted)."""
        if self.vocab_map is None:
            return out
        return expand_vocabulary(out, self.vocab_map, self.config.vocab_size)  # (B, T, V)
