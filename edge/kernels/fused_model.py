"""A model's weights as edge's fused C calls read them (csrc/layers.c), behind one object the kernel runner asks.

    fused = FusedWeights.build(matmul, shape, table)  # None: some tensor is in a form the kernel lacks
    fused.replaced()                                 a watched weight was replaced since: build again
    fused.fuses(rows, max_rows)                      whether a pass of `rows` rows runs its layers here
    fused.layers(x, order, start, cache, rope)       layers `order` over x (T, D) in place     fused_layers_f32
    fused.reads(ends)                                whether a whole pass reads this embedding, norm and head
    fused.step(ends, tokens, start, cache, rope)     embedding, every layer, norm, head        forward_step_f32
    fused.draft(ends, request, rope)                 request.k greedy draft tokens            draft_greedy_f32

The model hands over plain tensors (a LayerTable: each layer's 12 in the C table's order, TABLE_KINDS, None where one
is absent; and the embedding, final norm and head of a whole pass, edge/kernels/records.py ModelEnds) and its shape record
(edge.memory.footprint.ModelShape, read by field name: hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
rms_norm_eps). The pointers are taken once, so the tensors must stay where they are while the object is used;
`replaced()` tells, from the table's `watch` slots, when they moved.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

from edge.kernels.cpu_matmul import KernelCache, ModelView, RowwiseMatmul
from edge.kernels.records import FLOAT_FORMATS, DraftRequest, KernelDraft, ModelEnds, weight_format

# each layer's row of the pointer table (csrc/layers.c layer_team): attn_norm, wqkv, its bias, q_norm, k_norm, wo, its
# bias, ffn_norm, w_gate_up, its bias, w_down, its bias
TABLE_KINDS = ("norm", "matrix", "bias", "norm", "norm", "matrix", "bias", "norm", "matrix", "bias", "matrix", "bias")
MAX_HEAD_DIM = 512  # csrc/layers.c rope_rows rotates a head in a stack buffer of this many floats
KEPT_VIEWS = 4  # ModelViews kept per FusedWeights: the step's, and a drafter's head or two


class LayerTable(NamedTuple):
    """A model's decoder layers as the fused calls take them."""

    tensors: list[tuple]  # per layer, its 12 tensors in TABLE_KINDS order (None where one is absent)
    windows: list[int]  # per layer, its sliding window (0: none)
    packed_format: str | None  # the matrices' packed format ("int8", "blocks"), None for float ones
    watch: Iterable[tuple[dict, str]] = ()  # (mapping, key) slots whose contents replaced() checks


class FusedWeights:
    """The (L, 12) pointer table, sliding windows, layer orders and ModelViews of one model's layers."""

    def __init__(self, matmul: RowwiseMatmul, shape, table: LayerTable, layer_format: str,
                 norm_dtype: torch.dtype) -> None:
        self.matmul, self.shape, self.format, self.norm_dtype = matmul, shape, layer_format, norm_dtype
        self._table = torch.tensor([[0 if t is None else t.data_ptr() for t in row] for row in table.tensors],
                                   dtype=torch.int64)  # (L, 12)
        self._windows = torch.tensor(table.windows, dtype=torch.int64)  # (L,) 0: none
        self._orders: dict[tuple[int, ...], torch.Tensor] = {}
        self._every_layer = self._order(range(len(table.tensors)))  # (L,)
        self._layers_view = self._model_view()
        self._views: dict[tuple, tuple[ModelView, ModelEnds]] = {}  # the ends stay alive as long as their view
        self._watched = [(slots, key, slots[key], _address(slots[key])) for slots, key in table.watch]

    @classmethod
    def build(cls, matmul: RowwiseMatmul, shape, table: LayerTable) -> "FusedWeights | None":
        """From each layer's tensors in TABLE_KINDS order: float matrices (float32, or 16-bit widened in registers)
        with norms alike, or matrices packed in the table's packed_format ("int8", uint8 bytes; "blocks", each a
        BlockMatrix's table entry) with float32 norms; float32 biases; all contiguous. None where they are not (or
        heads are wider than the kernel rotates). `shape`: the model's shape record (see the module docstring)."""
        packed_format, layers = table.packed_format, table.tensors
        matrix_dtype = torch.uint8 if packed_format else layers[0][1].dtype
        layer_format = packed_format or FLOAT_FORMATS.get(matrix_dtype)
        if layer_format is None or shape.head_dim > MAX_HEAD_DIM:
            return None
        norm_dtype = torch.float32 if packed_format else matrix_dtype
        expected = {"norm": norm_dtype, "matrix": matrix_dtype, "bias": torch.float32}
        if any(t is not None and (t.dtype != expected[kind] or not t.is_contiguous())
               for row in layers for t, kind in zip(row, TABLE_KINDS)):
            return None
        return cls(matmul, shape, table, layer_format, norm_dtype)

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
               rope: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Layers `order` over x (T, D) float32 at positions [start, start + T), in place, in one C call; rope: cos,
        sin (T, Dh) of those positions."""
        cos, sin = rope
        self.matmul.layers(x, self._layers_view, self._order(order), cos, sin, cache, start)

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """RMSNorm(x) (T, D) in the same C library, or None where it does not read `weight`'s dtype."""
        return self.matmul.rms_norm(x, weight, self.shape.rms_norm_eps) if weight.dtype in FLOAT_FORMATS else None

    def reads(self, ends: ModelEnds) -> bool:
        """Whether a whole pass reads this embedding, final norm and head (else the model runs its parts)."""
        return self._view(ends) is not None

    def step(self, ends: ModelEnds, tokens: torch.Tensor, start: int, cache: KernelCache,
             rope: tuple[torch.Tensor, torch.Tensor],
             parents: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """tokens (T,) int64 at positions [start, start + T) through the embedding, every layer, the final norm and the
        head in one C call -> (hidden (T, D), logits (T, rows)) float32; None where it does not read the ends.
        rope: cos, sin (T, Dh) of the rows' positions; `parents` (T,) int64 makes the rows a token tree
        (RowwiseMatmul.forward_step)."""
        view = self._view(ends)
        if view is None:
            return None
        cos, sin = rope
        return self.matmul.forward_step(view, tokens, start, self._every_layer, cos, sin, cache, parents)

    def draft(self, ends: ModelEnds, request: DraftRequest,
              rope: tuple[torch.Tensor, torch.Tensor]) -> KernelDraft | None:
        """`request.k` greedy draft tokens in one C call (RowwiseMatmul.draft_greedy): the request's tokens through
        its layers (None: every layer), the norm and the head of `ends`, then one drafted token a step; rope: whole
        cos, sin tables from position 0. None where the kernel does not read the ends, or the norm or fc are not
        stored like the layers' norms (the C draft reads the fc in the layers' format)."""
        view = self._view(ends)
        features = request.features
        if view is None or ends.norm.dtype != self.norm_dtype or (
                features is not None and features.fc.dtype != self.norm_dtype):
            return None
        order = self._every_layer if request.layers is None else self._order(request.layers)
        return self.matmul.draft_greedy(view, request, order, rope, request.cache.kernel_cache())

    def _order(self, layers: Iterable[int]) -> torch.Tensor:
        """The int64 tensor (n,) of a layer set for the C calls, made once per set (all, or a self-draft's)."""
        key = tuple(layers)
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = torch.tensor(key, dtype=torch.int64)  # (n,)
        return order

    def _view(self, ends: ModelEnds) -> ModelView | None:
        """The ModelView of these layers with `ends`, made once per embedding, norm and head; None where the kernel
        does not read one of them."""
        embed, norm, head, _ = ends
        key = (embed.data_ptr(), norm.data_ptr(), head.weight.data_ptr(), head.rows)  # kept tensors keep addresses
        kept = self._views.get(key)
        if kept is not None:
            return kept[0]
        if not (ends.embedding_format is not None and norm.dtype in FLOAT_FORMATS and head.format is not None
                and embed.is_contiguous() and head.weight.is_contiguous()):
            return None
        if len(self._views) == KEPT_VIEWS:
            del self._views[next(iter(self._views))]  # the oldest
        view = self._model_view(ends)
        self._views[key] = (view, ends)
        return view

    def _model_view(self, ends: ModelEnds | None = None) -> ModelView:
        """The C side's ModelView: the layers, and the ends of a whole pass when given."""
        shape = self.shape
        view = ModelView(D=shape.hidden_size, H=shape.num_heads, Hkv=shape.num_kv_heads, Dh=shape.head_dim,
                         I=shape.intermediate_size, eps=shape.rms_norm_eps, scale=shape.head_dim ** -0.5,
                         format=weight_format(self.format),
                         weights=self._table.data_ptr(), windows=self._windows.data_ptr())
        if ends is not None:
            embed, norm, head, _ = ends
            view.V, view.head, view.head_format = head.rows, head.weight.data_ptr(), weight_format(head.format)
            view.embed, view.embed_format = embed.data_ptr(), weight_format(ends.embedding_format)
            view.norm, view.norm_format = norm.data_ptr(), weight_format(norm.dtype)
        return view


def _address(value) -> int | None:
    """A tensor's address, None for anything else."""
    return value.data_ptr() if isinstance(value, torch.Tensor) else None
