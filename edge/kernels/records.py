"""What edge's fused CPU calls are handed and hand back, as plain records: the float formats' names, a model's layers, a
head, the ends of a whole pass, a feature drafter's rows, a draft request and the draft it returns.

    request = DraftRequest(tokens, start, cache, k, head)     # one greedy draft: what to feed, where, how many
    drafted = runner.draft(model, request)                    # edge/kernels/runner.py: a KernelDraft, or None

The tensors are plain torch tensors; nothing here knows the model that holds them (this package imports nothing from
edge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

import torch

# the weight formats' names: the float dtypes' here, and the packed "int8" (edge/kernels/cpu_packing.py) and "blocks"
# (a BlockMatrix of llama.cpp's block formats, edge/kernels/block_formats.py); the C side's WEIGHTS_<NAME> numbers
# come from its header (edge/kernels/cpu_kernel.py weight_format)
FLOAT_FORMATS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class LayerTable(NamedTuple):
    """A model's decoder layers as the fused calls take them: their tensors, and what they compute beside the Llama
    layout's defaults (Gemma 3's GeGLU, local layers and scores' scale, Phi-3's partial rotary)."""

    tensors: list[dict]  # per layer, its tensors by the C table's slot names (cpu_kernel.SLOTS; None where absent)
    windows: list[int]  # per layer, its sliding window (0: none)
    packed_format: str | None  # the matrices' packed format ("int8", "blocks"), None for float ones
    watch: Iterable[tuple[dict, str]] = ()  # (mapping, key) slots whose contents replaced() checks
    rope_tables: list[int] | None = None  # per layer, which rotary table it reads (1: Gemma 3's local); None: 0 for all
    rotary_dim: int | None = None  # the leading dims of a head that rotate; None: all of them
    activation: str = "silu"  # the feed-forward gate's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    scale: float | None = None  # the attention scores' scale; None: head_dim ** -0.5


class KernelHead(NamedTuple):
    """A head the C calls score rows with: `weight` (rows, D) float, or packed bytes (uint8) in `packed_format`."""

    weight: torch.Tensor
    rows: int  # tokens it scores
    token_ids: torch.Tensor | None = None  # (rows,) int64: each row's token (a trimmed head); None: row v is token v
    packed_format: str | None = None  # "int8" (edge/kernels/cpu_packing.py), "blocks" (a BlockMatrix's table entry)

    @property
    def format(self) -> str | None:
        """Its C format name, None where the kernel does not read it."""
        return self.packed_format or FLOAT_FORMATS.get(self.weight.dtype)


class ModelEnds(NamedTuple):
    """What a whole pass reads beside the layers."""

    embed: torch.Tensor  # (V, D), or a BlockMatrix's table entry (embed_format "blocks")
    norm: torch.Tensor  # (D,) the final norm's weight
    head: KernelHead
    embed_format: str | None = None  # None: the embedding's dtype
    embed_scale: float | None = None  # an embedding row is multiplied by it (Gemma: sqrt(D)); None: not scaled
    softcap: float | None = None  # the logits are capped to softcap * tanh(logits / softcap); None: not capped

    @property
    def embedding_format(self) -> str | None:
        """Its C format name, None where the kernel does not read it."""
        return self.embed_format or FLOAT_FORMATS.get(self.embed.dtype)


class LayerCapture(NamedTuple):
    """Residual streams a fused pass copies out as it runs (EAGLE-3's target features): after layer layers[c], row t's
    stream (D floats) goes to rows[t, c * D:(c + 1) * D]."""

    layers: torch.Tensor  # (n,) int64; a layer may appear more than once
    rows: torch.Tensor  # (T, >= n * D) float32, the pass's rows in order (rows of a longer buffer; each contiguous)


class FeatureRows(NamedTuple):
    """A feature drafter's input: each row is fc(cat(feature, embedding)); after the first rows the feature is the
    previous step's normed output."""

    features: torch.Tensor  # (T0, D) the first rows' features (the target's normed hidden states)
    fc: torch.Tensor  # (D, 2D) the fusion, stored like the layers' norms


@dataclass
class DraftRequest:
    """One greedy draft of `k` tokens in one C call: `tokens` run at positions [start, start + len(tokens)) through
    `layers` (None: every layer; a subset is a self-draft, which leaves the cache's length alone), the final norm and
    `head` with argmax; each later step runs the token just drafted. With `features` the rows are a feature
    drafter's. `stop_below` stops before a token (never the first) whose probability is below it, so fewer than k may
    come back; `runners_up` also asks each step's second most likely token and both tokens' probabilities (what a
    token tree is built from). `cache` is the drafter's KV cache: anything with `length`, `max_len` and
    `kernel_cache()` (edge.model.kv_cache.KVCache, the quantized ones)."""

    tokens: list[int]
    start: int
    cache: object
    k: int
    head: KernelHead
    layers: list[int] | None = None
    features: FeatureRows | None = None
    stop_below: float | None = None
    runners_up: bool = False


class KernelDraft(NamedTuple):
    """What one-call greedy drafting returns: the tokens, and when asked each step's runner-up token and the
    probabilities [draft token's, runner-up's]."""

    tokens: list[int]
    runners_up: list[int] | None = None
    probabilities: list[list[float]] | None = None
