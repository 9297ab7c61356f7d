"""One model's passes on edge's CPU kernel: whether a pass runs fused and how, and which matmul each projection takes.

    runner = KernelRunner(RowwiseMatmul.load())       # None: torch's matmul and attention throughout
    runner.linear(x, weight, bias)                    a projection: the batch-invariant kernel for up to max_rows rows
                                                      (any number with 16-bit weights), torch otherwise
    runner.attention(q, keys, values, start, window)  the kernel's attention for a short pass, else None (SDPA)
    runner.fuses(model, rows, dtype, cache)           whether a pass runs its layers in fused C calls
    runner.layers(x, order, start, cache, rope)       those layers, in chunks of rows
    runner.step(model, tokens, start, cache, parents) embedding to logits in one C call (a token tree too)
    runner.draft(model, request)                      k greedy draft tokens in one C call (records.DraftRequest)

A runner belongs to one model: the model's projections are made bound to it (edge/model/linears.py), so `use()` and
`widen()` change the matmul and the row limit of every one of them at once. It knows no model class (this package
imports nothing from edge): a pass hands it `model`, anything with these plain-data members (edge/model/kernel_glue.py
ModelTensors reads them off a Transformer):

    model.shape             the shape record: hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
                            rms_norm_eps (edge.memory.footprint.ModelShape)
    model.dtype             the dtype of activations and of the KV cache
    model.layer_table()     the decoder layers' tensors (fused_model.LayerTable), or None where one is not readable
    model.ends(head)        the embedding, final norm and `head` (None: its own), records.ModelEnds
    model.rope(start, end)  cos, sin (T, Dh) float32 of positions [start, end)

and a cache is anything with `length`, `max_len` and `kernel_cache()` (a KernelCache, or None where the fused calls
cannot read it).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

from edge.kernels.block_formats import BlockMatrix
from edge.kernels.cpu_matmul import ROWWISE_MAX_ROWS, RowwiseMatmul
from edge.kernels.fused_model import FusedWeights
from edge.kernels.records import DraftRequest, KernelDraft

FUSED_CHUNK = 128  # longer passes through the fused kernel (prompts) run in chunks of rows: linear scratch memory
TREE_ROWS = 64  # the most rows of a token tree's verify pass (csrc/attention.c TREE_ROWS)


class KernelRunner:
    def __init__(self, matmul: RowwiseMatmul | None = None, max_rows: int = ROWWISE_MAX_ROWS) -> None:
        """`matmul`: the batch-invariant kernel (None: torch throughout). Passes of up to `max_rows` rows take it for
        every projection and the attention, so a (k + 1)-token verify pass reproduces k + 1 decode steps bit for bit."""
        self.matmul, self.max_rows = matmul, max_rows
        self._fused: FusedWeights | bool | None = None  # made at first use; False: the weights are not fusable

    def use(self, matmul: RowwiseMatmul | None, max_rows: int | None = None) -> None:
        """Run on `matmul` from now on (None: torch's matmul throughout), with `max_rows` when given."""
        self.matmul = matmul
        if max_rows is not None:
            self.max_rows = max_rows
        self._fused = None  # the fused calls run on the matmul: made again at the next pass

    def widen(self, rows: int) -> None:
        """Let passes of up to `rows` rows take the batch-invariant path (a verify pass of k + 1 tokens must take the
        path a 1-token decode step takes)."""
        if self.matmul is not None and rows > self.max_rows:
            self.max_rows = rows

    def weights_changed(self) -> None:
        """The model's weights were replaced or stored anew: the fused calls find them again at the next pass."""
        self._fused = None

    @property
    def fused_format(self) -> str | None:
        """The format the fused C calls read the layers in ("float32", "bfloat16", "float16", "int8", "blocks"), None
        before any fused pass or where they do not read them."""
        return self._fused.format if self._fused else None

    # ---- one projection or attention at a time ----------------------------------------------------------------

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x @ weight.T + bias: through the batch-invariant kernel for up to `max_rows` rows, and for any number of rows
        of 16-bit weights (the kernel widens them in registers, several times faster than torch widening a copy);
        torch otherwise."""
        matmul = self.matmul
        if matmul is not None and x.dtype == torch.float32 and (
                x.numel() // x.shape[-1] <= self.max_rows
                or weight.dtype != torch.float32 and matmul.supports(weight, bias)):
            return matmul(x, weight, bias)
        if weight.dtype != x.dtype:  # weights stored in bfloat16 for float32 compute: widen for this call only
            weight = weight.to(x.dtype)
        return F.linear(x, weight, bias)

    def quantized(self, x: torch.Tensor, packed: torch.Tensor, fmt: str, out_features: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32 through packed weights (edge/kernels/cpu_packing.py), on the kernel for every row count."""
        return self._kernel().quantized(x, packed, fmt, out_features, bias)

    def blocks(self, x: torch.Tensor, matrix: BlockMatrix, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32 through a BlockMatrix, on the kernel for every row count."""
        return self._kernel().blocks(x, matrix, bias)

    def packed_head(self, x: torch.Tensor, head: BlockMatrix | torch.Tensor, rows: int) -> torch.Tensor | None:
        """x (N, D) float32 through a head in a packed format (a BlockMatrix, or int8 bytes of `rows` rows) ->
        (N, rows); None without the kernel (the caller scores with its float head)."""
        if self.matmul is None:
            return None
        if isinstance(head, BlockMatrix):
            return self.matmul.blocks(x, head)
        return self.matmul.quantized(x, head, "int8", rows)

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                  window: int | None) -> torch.Tensor | None:
        """q (1, H, T, Dh) over keys/values (1, Hkv, S, Dh) in the batch-invariant kernel when the pass is short
        enough for it (float32, one sequence, up to max_rows rows); None otherwise (the caller uses torch's)."""
        if self.matmul is None or q.shape[0] != 1 or q.shape[2] > self.max_rows or q.dtype != torch.float32:
            return None
        return self.matmul.attention(q, keys, values, start, window)  # (1, H, T, Dh)

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """The final RMSNorm of x (T, D) after fused layers, in the same C library; None where it does not read the
        weight (the caller runs its own)."""
        return self._fused.norm(x, weight)

    # ---- whole passes ---------------------------------------------------------------------------------------

    def fuses(self, model, rows: int, dtype: torch.dtype, cache, batch: int = 1) -> bool:
        """Whether a pass of `rows` rows can run its layers in fused C calls: batch 1 in float32 (up to max_rows rows
        with float32 weights, any number with 16-bit or packed ones), a cache the calls read (kernel_cache()), every
        layer in a form the kernel reads. Builds the fused weights at first use, and again after they were replaced."""
        if self.matmul is None or batch != 1 or dtype != torch.float32:
            return False
        if self._fused is None or (self._fused and self._fused.replaced()):
            table = model.layer_table()
            self._fused = (table is not None and FusedWeights.build(self.matmul, model.shape, table)) or False
        kernel_cache = getattr(cache, "kernel_cache", None)
        return (self._fused is not False and self._fused.fuses(rows, self.max_rows)
                and kernel_cache is not None and kernel_cache() is not None)

    def layers(self, x: torch.Tensor, order: Iterable[int], start: int, cache,
               rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Layers `order` over x (T, D) at positions [start, start + T) after fuses() said yes, in C calls of up to
        FUSED_CHUNK rows (a row's operations do not depend on the chunk); rope: cos, sin (T, Dh) -> x (T, D)."""
        steps = x.shape[0]
        if start + steps > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} positions; writing up to {start + steps} does not fit")
        x = x.contiguous()  # updated in place layer by layer
        cos, sin = rope
        for first in range(0, steps, FUSED_CHUNK):
            last = min(first + FUSED_CHUNK, steps)
            self._fused.layers(x[first:last], order, start + first, cache.kernel_cache(),
                               (cos[first:last], sin[first:last]))
        return x

    def step(self, model, tokens: torch.Tensor, start: int, cache,
             parents: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A decode step or verify pass, tokens (B, T) at positions [start, start + T), through the embedding, every
        layer, the final norm and the head in one C call -> hidden (T, D), logits (T, V); None where that call cannot
        run it (then the model runs its parts). `parents` makes the rows a token tree (verifies_trees()): row t
        continues row parents[t] (-1: the cache) at position start + its depth and sees only the rows on its path;
        its keys/values go to slot start + t. The caller sets the cache's length."""
        batch, steps = tokens.shape
        end = start + steps
        longest = FUSED_CHUNK if parents is None else min(FUSED_CHUNK, TREE_ROWS)
        if not (steps <= longest and start <= cache.length and end <= cache.max_len
                and self.fuses(model, steps, model.dtype, cache, batch)):
            return None
        if parents is None:
            rope, tree = model.rope(start, end), None
        else:
            rope, tree = _tree_rope(model, start, parents), torch.tensor(parents, dtype=torch.int64)  # (T,)
        return self._fused.step(model.ends(), tokens[0], start, cache.kernel_cache(), rope, tree)

    def verifies_trees(self, model, cache, rows: int = 2) -> bool:
        """Whether a token tree of `rows` rows can be verified in one pass (step() with parents): the fused step over
        this cache."""
        return (rows <= min(FUSED_CHUNK, TREE_ROWS) and self.fuses(model, rows, model.dtype, cache)
                and self._fused.reads(model.ends()))

    def draft(self, model, request: DraftRequest) -> KernelDraft | None:
        """request.k greedy draft tokens in one C call (records.DraftRequest says what it asks), or None where that
        path is not available (then the drafter drafts step by step). With every layer it sets the cache's length
        like a full pass over the rows it ran; a subset of layers (a self-draft) leaves it alone."""
        cache, start, fed, k = request.cache, request.start, len(request.tokens), request.k
        end = start + fed + k - 1
        if not self.fuses(model, fed, torch.float32, cache) or end > cache.max_len or start > cache.length:
            return None
        drafted = self._fused.draft(model.ends(request.head), request, model.rope(0, end))
        if drafted is not None and request.layers is None:
            # the rows run: the fed tokens, then each drafted token but a full draft's last (a draft that stopped ran
            # its last to score the next)
            cache.length = start + fed + min(len(drafted.tokens), k - 1)
        return drafted

    def _kernel(self) -> RowwiseMatmul:
        if self.matmul is None:
            raise RuntimeError("int8 and block-format weights run only on edge's CPU kernel; keep the model on the CPU")
        return self.matmul


def _tree_rope(model, start: int, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, Dh) of a token tree's rows: row t is at position start + its depth (parents[t] is the row it
    continues, an earlier one, or -1)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(depths[parent] + 1 if parent >= 0 else 0)
    cos, sin = model.rope(0, start + max(depths) + 1)  # (S, Dh) each
    rows = torch.tensor(depths) + start  # (T,) each row's position
    return cos[rows], sin[rows]  # (T, Dh) each
