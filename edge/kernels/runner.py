"""One model's passes on edge's CPU kernel: whether a pass runs fused and how, which matmul each projection takes, and
the model's weights as the fused calls read them (FusedWeights).

    runner = KernelRunner(CpuKernel.load())           # None: torch's matmul and attention throughout
    runner.linear(x, weight, bias)                    a projection: the batch-invariant kernel for up to max_rows rows
                                                      (any number with 16-bit weights), torch otherwise
    runner.attention(q, keys, values, start, window)  the kernel's attention for a short pass, else None (SDPA)
    runner.fuses(model, rows, dtype, cache)           whether a pass runs its layers in fused C calls
    runner.layers(x, order, start, cache, rope)       those layers, in chunks of rows
    runner.step(model, tokens, start, cache, parents) embedding to logits in one C call (a token tree too)
                                                      (both take capture=records.LayerCapture: copy out the residual
                                                      streams after chosen layers as the pass runs)
    runner.draft(model, request)                      k greedy draft tokens in one C call (records.DraftRequest)

A runner belongs to one model: the model's projections are made bound to it (edge/model/linears.py), so `use()` and
`widen()` change the matmul and the row limit of every one of them at once. It knows no model class (this package
imports nothing from edge): a pass hands it `model`, anything with these plain-data members (edge/model/kernel_glue.py
ModelTensors reads them off a Transformer):

    model.shape             the shape record: hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
                            rms_norm_eps (edge.memory.footprint.ModelShape)
    model.dtype             the dtype of activations and of the KV cache
    model.layer_table()     the decoder layers' tensors (records.LayerTable), or None where one is not readable
    model.ends(head)        the embedding, final norm and `head` (None: its own), records.ModelEnds
    model.rope(start, end)  cos, sin (T, W) float32 of positions [start, end): per position the rotary tables the
                            layer table names side by side (records.LayerTable rope_tables; each rotary_dim wide)

and a cache is anything with `length`, `max_len` and `kernel_cache()` (a KernelCache, or None where the fused calls
cannot read it).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, TypeVar

import torch
import torch.nn.functional as F

from edge.kernels.block_formats import BlockMatrix
from edge.kernels.cpu_kernel import CONSTANTS, ROWWISE_MAX_ROWS, SLOTS, CpuKernel, KernelCache, LayerViews, slot_kind
from edge.kernels.threads import ThreadGovernor, candidate_counts
from edge.kernels.records import FLOAT_FORMATS, DraftRequest, KernelDraft, LayerCapture, LayerTable, ModelEnds

FUSED_CHUNK = 128  # longer passes through the fused kernel (prompts) run in chunks of rows: linear scratch memory
TREE_ROWS = CONSTANTS["TREE_ROWS"]  # the most rows of a token tree's verify pass
DRAFT_ROWS = 0  # the thread governor's key for one-call drafts, timed per drafted token (no pass has 0 rows)
MAX_HEAD_DIM = CONSTANTS["MAX_HEAD_DIM"]  # the widest head the fused calls rotate
T = TypeVar("T")
KEPT_VIEWS = 4  # ModelViews kept per FusedWeights: the step's, and a drafter's head or two


class KernelRunner:
    def __init__(self, matmul: CpuKernel | None = None, max_rows: int = ROWWISE_MAX_ROWS) -> None:
        """`matmul`: the batch-invariant kernel (None: torch throughout). Passes of up to `max_rows` rows take it for
        every projection and the attention, so a (k + 1)-token verify pass reproduces k + 1 decode steps bit for bit."""
        self.matmul, self.max_rows = matmul, max_rows
        self._fused: FusedWeights | bool | None = None  # made at first use; False: the weights are not fusable

    def use(self, matmul: CpuKernel | None, max_rows: int | None = None) -> None:
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
               rope: tuple[torch.Tensor, torch.Tensor], capture: LayerCapture | None = None) -> torch.Tensor:
        """Layers `order` over x (T, D) at positions [start, start + T) after fuses() said yes, in C calls of up to
        FUSED_CHUNK rows (a row's operations do not depend on the chunk); rope: cos, sin (T, W), the model's rope()
        of those positions -> x (T, D). `capture` (rows (T, n * D)) receives the residual streams after its layers."""
        steps = x.shape[0]
        if start + steps > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} positions; writing up to {start + steps} does not fit")
        x = x.contiguous()  # updated in place layer by layer
        cos, sin = rope
        for first in range(0, steps, FUSED_CHUNK):
            last = min(first + FUSED_CHUNK, steps)
            chunk = None if capture is None else LayerCapture(capture.layers, capture.rows[first:last])
            self._fused.layers(x[first:last], order, start + first, cache.kernel_cache(),
                               (cos[first:last], sin[first:last]), chunk)
        return x

    def step(self, model, tokens: torch.Tensor, start: int, cache, parents: list[int] | None = None,
             capture: LayerCapture | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A decode step or verify pass, tokens (B, T) at positions [start, start + T), through the embedding, every
        layer, the final norm and the head in one C call -> hidden (T, D), logits (T, V); None where that call cannot
        run it (then the model runs its parts). `parents` makes the rows a token tree (verifies_trees()): row t
        continues row parents[t] (-1: the cache) at position start + its depth and sees only the rows on its path;
        its keys/values go to slot start + t. `capture` (rows (T, n * D)) receives the residual streams after its
        layers, row t at rows[t]. The caller sets the cache's length."""
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
        return self._fused.step(model.ends(), tokens[0], start, cache.kernel_cache(), rope, tree, capture)

    def step_rows(self, model, tokens: torch.Tensor, slots: torch.Tensor, firsts: torch.Tensor,
                  cache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Several sequences' rows in one pass (continuous batching): tokens, slots, firsts (T,) int64; row t is the
        token at cache slot slots[t] of the sequence whose region starts at firsts[t] (its position slots[t] -
        firsts[t]), and sees that sequence's slots up to its own. -> hidden (T, D), logits (T, V); None where the
        fused step cannot run it. Each row computes what it computes in a pass of its sequence alone. The caller
        keeps each sequence's length."""
        steps = tokens.numel()
        span = int(slots.max()) + 1
        if not (steps <= FUSED_CHUNK and span <= cache.max_len and bool((firsts <= slots).all())
                and self.fuses(model, steps, model.dtype, cache)):
            return None
        positions = slots - firsts  # (T,)
        cos, sin = model.rope(0, int(positions.max()) + 1)  # (S, W) each
        rows = (slots.to(torch.int64).contiguous(), firsts.to(torch.int64).contiguous())
        return self._fused.step(model.ends(), tokens.to(torch.int64).contiguous(), span - steps,
                                cache.kernel_cache(), (cos[positions], sin[positions]), None, None, rows)

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

    def _kernel(self) -> CpuKernel:
        if self.matmul is None:
            raise RuntimeError("int8 and block-format weights run only on edge's CPU kernel; keep the model on the CPU")
        return self.matmul


class FusedWeights:
    """A model's layers as the fused C calls read them: the LayerWeights table with each layer's window and rotary
    table (cpu_kernel.LayerViews), layer orders and ModelViews. The model hands over plain tensors (a LayerTable; the
    ends of a whole pass, records.ModelEnds) and its shape record; the pointers are taken once, so the tensors must
    stay where they are while the object is used, and `replaced()` tells, from the table's `watch` slots, when they
    moved.

        fused = FusedWeights.build(kernel, shape, table)  # None: some tensor is in a form the kernel lacks
        fused.layers(x, order, start, cache, rope)       layers `order` over x (T, D) in place     fused_layers_f32
        fused.step(ends, tokens, start, cache, rope)     embedding, every layer, norm, head        forward_step_f32
        fused.draft(ends, request, rope)                 request.k greedy draft tokens            draft_greedy_f32
    """

    def __init__(self, kernel: CpuKernel, shape, table: LayerTable, layer_format: str,
                 norm_dtype: torch.dtype) -> None:
        self.matmul, self.shape, self.format, self.norm_dtype = kernel, shape, layer_format, norm_dtype
        self._layer_views = LayerViews(shape, table, layer_format)
        self._orders: dict[tuple[int, ...], torch.Tensor] = {}
        self._every_layer = self._order(range(len(table.tensors)))  # (L,)
        self._layers_view = self._layer_views.view()
        self._views: dict[tuple, tuple[object, ModelEnds]] = {}  # the ends stay alive as long as their view
        self._watched = [(slots, key, slots[key], _address(slots[key])) for slots, key in table.watch]
        self._governor: ThreadGovernor | None = None  # made for the kernel's thread count (_team)

    @classmethod
    def build(cls, kernel: CpuKernel, shape, table: LayerTable) -> "FusedWeights | None":
        """From each layer's tensors by slot name (cpu_kernel.SLOTS): float matrices (float32, or 16-bit widened in
        registers) with norms alike, or matrices packed in the table's packed_format ("int8", uint8 bytes; "blocks",
        each a BlockMatrix's table entry) with float32 norms; float32 biases; all contiguous. None where they are not
        (or heads are wider than the kernel rotates). `shape`: the model's shape record (see cpu_kernel.model_view)."""
        packed_format, layers = table.packed_format, table.tensors
        if any(set(row) != set(SLOTS) for row in layers):
            raise ValueError(f"a layer's tensors are named by the C table's slots {SLOTS}")
        matrix_dtype = torch.uint8 if packed_format else layers[0]["wqkv"].dtype
        layer_format = packed_format or FLOAT_FORMATS.get(matrix_dtype)
        if layer_format is None or shape.head_dim > MAX_HEAD_DIM:
            return None
        norm_dtype = torch.float32 if packed_format else matrix_dtype
        expected = {"norm": norm_dtype, "matrix": matrix_dtype, "bias": torch.float32}
        if any(t is not None and (t.dtype != expected[slot_kind(slot)] or not t.is_contiguous())
               for row in layers for slot, t in row.items()):
            return None
        return cls(kernel, shape, table, layer_format, norm_dtype)

    def replaced(self) -> bool:
        """Whether a watched slot now holds another object, or a tensor at another address (a replaced module,
        load_state_dict(assign=True)): dictionary lookups, cheap enough for every pass."""
        for slots, key, seen, address in self._watched:
            current = slots.get(key)
            if (_address(current) != address) if address is not None else (current is not seen):
                return True
        return False

    def fuses(self, rows: int, max_rows: int) -> bool:
        """Whether a pass of `rows` rows runs here: float32 weights up to `max_rows` rows (a longer prompt is faster in
        torch's GEMM), 16-bit and packed ones at any length."""
        return rows <= max_rows or self.format != "float32"

    def layers(self, x: torch.Tensor, order: Iterable[int], start: int, cache: KernelCache,
               rope: tuple[torch.Tensor, torch.Tensor], capture: LayerCapture | None = None) -> None:
        """Layers `order` over x (T, D) float32 at positions [start, start + T), in place, in one C call; rope: cos,
        sin (T, W) of those positions; `capture`: residual streams to copy out."""
        cos, sin = rope
        governor = self._team()  # a prompt's chunks run on the count decode steps measured fastest
        kernel = self._kernels[governor.current] if governor is not None else self.matmul
        kernel.layers(x, self._layers_view, self._order(order), cos, sin, cache, start, capture)

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """RMSNorm(x) (T, D) in the same C library, or None where it does not read `weight`'s dtype."""
        return self.matmul.rms_norm(x, weight, self.shape.rms_norm_eps) if weight.dtype in FLOAT_FORMATS else None

    def reads(self, ends: ModelEnds) -> bool:
        """Whether a whole pass reads this embedding, final norm and head (else the model runs its parts)."""
        return self._view(ends) is not None

    def step(self, ends: ModelEnds, tokens: torch.Tensor, start: int, cache: KernelCache,
             rope: tuple[torch.Tensor, torch.Tensor], parents: torch.Tensor | None = None,
             capture: LayerCapture | None = None,
             rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """tokens (T,) int64 at positions [start, start + T) through the embedding, every layer, the final norm and the
        head in one C call -> (hidden (T, D), logits (T, rows)) float32; None where it does not read the ends.
        rope: cos, sin (T, W) of the rows' positions; `parents` (T,) int64 makes the rows a token tree
        (CpuKernel.forward_step); `capture`: residual streams to copy out; `rows` (slots, firsts): several
        sequences' rows (CpuKernel.forward_step)."""
        view = self._view(ends)
        if view is None:
            return None
        cos, sin = rope
        return self._governed(tokens.numel(), lambda kernel: kernel.forward_step(
            view, tokens, start, self._every_layer, cos, sin, cache, parents, capture, rows))

    def _governed(self, rows: int, call: Callable[[CpuKernel], T], units: Callable[[T], int] = lambda _: 1) -> T:
        """`call` on the kernel of the thread count the governor picks for `rows` (the full count without one), its
        time recorded per unit of its result (`units`: 0 records nothing)."""
        governor = self._team()
        if governor is None:
            return call(self.matmul)
        threads = governor.next(rows)
        started = time.perf_counter()
        out = call(self._kernels[threads])
        count = units(out)
        if count:
            governor.record(threads, rows, (time.perf_counter() - started) / count)
        return out

    def _team(self) -> ThreadGovernor | None:
        """The governor of whole passes' thread count (threads.py: a busy machine stalls a full team at every
        barrier), made again when the kernel's count changes (torch's, or --threads); None for one thread or with
        EDGE_ADAPTIVE_THREADS=0."""
        most = self.matmul.thread_count()
        if self._governor is None or self._governor.counts[0] != most:
            if most == 1 or not ThreadGovernor.enabled():
                return None
            self._governor = ThreadGovernor(most)
            self._kernels = {count: self.matmul.with_threads(count) for count in candidate_counts(most)}
        return self._governor

    def draft(self, ends: ModelEnds, request: DraftRequest,
              rope: tuple[torch.Tensor, torch.Tensor]) -> KernelDraft | None:
        """`request.k` greedy draft tokens in one C call (CpuKernel.draft_greedy): the request's tokens through its
        layers (None: every layer), the norm and the head of `ends`, then one drafted token a step; rope: whole cos,
        sin tables from position 0. None where the kernel does not read the ends, or the norm or fc are not stored
        like the layers' norms (the C draft reads the fc in the layers' format). Its thread count is governed as
        whole passes' are (threads.py), timed per drafted token: each of its tokens meets the team at every layer."""
        view = self._view(ends)
        features = request.features
        if view is None or ends.norm.dtype != self.norm_dtype or (
                features is not None and features.fc.dtype != self.norm_dtype):
            return None
        order = self._every_layer if request.layers is None else self._order(request.layers)
        catching_up = len(request.tokens) > 1  # a catch-up over several tokens is not what a drafted token costs
        return self._governed(DRAFT_ROWS, lambda kernel: kernel.draft_greedy(view, request, order, rope,
                                                                             request.cache.kernel_cache()),
                              lambda drafted: 0 if catching_up else len(drafted.tokens))

    def _order(self, layers: Iterable[int]) -> torch.Tensor:
        """The int64 tensor (n,) of a layer set for the C calls, made once per set (all, or a self-draft's)."""
        key = tuple(layers)
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = torch.tensor(key, dtype=torch.int64)  # (n,)
        return order

    def _view(self, ends: ModelEnds):
        """The ModelView of these layers with `ends`, made once per embedding, norm and head; None where the kernel
        does not read one of them."""
        embed, norm, head = ends.embed, ends.norm, ends.head
        key = (embed.data_ptr(), norm.data_ptr(), head.weight.data_ptr(), head.rows)  # kept tensors keep addresses
        kept = self._views.get(key)
        if kept is not None:
            return kept[0]
        if not (ends.embedding_format is not None and norm.dtype in FLOAT_FORMATS and head.format is not None
                and embed.is_contiguous() and head.weight.is_contiguous()):
            return None
        if len(self._views) == KEPT_VIEWS:
            del self._views[next(iter(self._views))]  # the oldest
        view = self._layer_views.view(ends)
        self._views[key] = (view, ends)
        return view


def _address(value) -> int | None:
    """A tensor's address, None for anything else."""
    return value.data_ptr() if isinstance(value, torch.Tensor) else None


def _tree_rope(model, start: int, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, W) of a token tree's rows: row t is at position start + its depth (parents[t] is the row it
    continues, an earlier one, or -1)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(depths[parent] + 1 if parent >= 0 else 0)
    cos, sin = model.rope(0, start + max(depths) + 1)  # (S, W) each
    rows = torch.tensor(depths) + start  # (T,) each row's position
    return cos[rows], sin[rows]  # (T, W) each
