"""edge's CPU kernel library (csrc/): its matmuls, attention and fused passes, bound through cffi from the one header
that declares its interface (csrc/interface.h). The install's library of this CPU's path (cpu_paths.py), else built
once at run time and cached. `CpuKernel.load()` returns None where there is none and none can be built (no C
compiler with OpenMP); callers then use torch's matmul, which is fast but not batch-invariant.

    kernel = CpuKernel.load()          # the best path here, or EDGE_CPU_KERNEL's
    kernel.path                        # "avx2", "avx512-vnni", "neon-dotprod", "portable", ...
    y = kernel(x, weight, bias)        # x (..., K) float32, weight (N, K) float32/bfloat16/float16 -> (..., N) float32
    y = kernel.quantized(x, packed, "int8", N, bias)   # packed by edge/kernels/cpu_packing.py
    y = kernel.blocks(x, matrix, bias)                 # llama.cpp's block formats (edge/kernels/block_formats.py)
    kernel.forward_step(view, tokens, ...)             # a whole pass over a LayerViews(...).view() in one call

Nothing of the C side is restated here: the structs, enums and constants come from the header (`ffi`, `CONSTANTS`,
`SLOTS`), and tests/kernels/test_interface_layout.py holds cffi's reading of them to the compiler's.
Set EDGE_ROWWISE_MATMUL=0 to turn the kernel off.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import subprocess
import threading
import time
from functools import lru_cache

import cffi
import torch

from edge.kernels import cpu_paths
from edge.kernels.records import FLOAT_FORMATS, DraftRequest, KernelDraft, LayerCapture, LayerTable, ModelEnds

log = logging.getLogger(__name__)
HEADER = cpu_paths.SOURCE_DIR / "interface.h"
ROWWISE_MAX_ROWS = 16  # decode steps and verify passes (k + 1 <= 13 by default) use the batch-invariant matmul


def declarations(text: str) -> str:
    """The part of interface.h that cffi's cdef reads: the text without its include guard, #include lines and
    _Static_assert lines (each kept on one line in the header)."""
    skipped = re.compile(r"\s*(#ifndef|#endif|#include|_Static_assert|#define\s+\w+\s*$)")
    return "\n".join(line for line in text.splitlines() if not skipped.match(line))


def interface(text: str | None = None) -> cffi.FFI:
    """A cffi FFI that has read the header (`text`: another header's text, for the layout test)."""
    ffi = cffi.FFI()
    ffi.cdef(declarations(HEADER.read_text() if text is None else text))
    return ffi


def enum_constants(ffi: cffi.FFI) -> dict[str, int]:
    """Every enum constant the header declares, by name (TREE_ROWS, WEIGHTS_INT8, BLOCKS_Q4_K, SLOT_WO, ...)."""
    constants: dict[str, int] = {}
    for name in ffi.list_types()[0]:
        kind = ffi.typeof(name)
        if kind.kind == "enum":
            constants.update(kind.relements)
    return constants


ffi = interface()
CONSTANTS = enum_constants(ffi)
# a decoder layer's slots in the C table's order (LayerSlot), by name: "attn_norm", "wqkv", "qkv_bias", ...
SLOTS = tuple(name.removeprefix("SLOT_").lower()
              for _, name in sorted(ffi.typeof("LayerSlot").elements.items()) if name != "SLOT_COUNT")


def slot_kind(slot: str) -> str:
    """What a slot holds, from its name: "norm", "bias" or "matrix"."""
    return slot.rsplit("_", 1)[-1] if slot.endswith(("_norm", "_bias")) else "matrix"


# the WeightFormat numbers by name (WEIGHTS_INT8 -> "int8") and by float dtype, looked up on every matmul call
WEIGHT_FORMATS = {name.removeprefix("WEIGHTS_").lower(): value
                  for value, name in ffi.typeof("WeightFormat").elements.items()}
_DTYPE_FORMATS = {dtype: WEIGHT_FORMATS[name] for dtype, name in FLOAT_FORMATS.items()}
_VOID_P = ffi.typeof("void *")
# the feed-forward gate's Activation numbers by name (ACTIVATION_GELU_TANH -> "gelu_tanh")
ACTIVATIONS = {name.removeprefix("ACTIVATION_").lower(): value
               for value, name in ffi.typeof("Activation").elements.items()}


def weight_format(dtype: torch.dtype | str) -> int:
    """The C side's WeightFormat of a float dtype or a format name ("float32", "int8", "blocks", ...)."""
    return WEIGHT_FORMATS[dtype] if isinstance(dtype, str) else _DTYPE_FORMATS[dtype]


def pointer(tensor: torch.Tensor | None):
    """A tensor's address as a C pointer argument or field, NULL for no tensor."""
    return ffi.NULL if tensor is None else ffi.cast(_VOID_P, tensor.data_ptr())


def capture_struct(capture: LayerCapture | None):
    """The C side's Capture of a LayerCapture (rows float32, each row contiguous), NULL for none; the caller keeps the
    record alive through the call."""
    if capture is None:
        return ffi.NULL
    layers, rows = capture
    return ffi.new("Capture *", {"layers": pointer(layers), "count": layers.numel(), "rows": pointer(rows),
                                 "row_stride": rows.stride(0)})


def row_slots_struct(rows: tuple[torch.Tensor, torch.Tensor] | None):
    """The C side's RowSlots of (slots, firsts) (T,) int64 each, NULL for none; the caller keeps them alive."""
    if rows is None:
        return ffi.NULL
    slots, firsts = rows
    return ffi.new("RowSlots *", {"slots": pointer(slots), "firsts": pointer(firsts)})


class KernelCache:
    """The KV cache a fused call reads and writes: float32 keys/values (L, 1, Hkv, S, Dh), or QuantSpec's hierarchical
    one (hierarchical()). Holds the tensors it points at."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None, max_len: int,
                 hierarchical=None, kept: tuple = ()) -> None:
        self.keys, self.values, self.max_len, self.hierarchical, self._kept = keys, values, max_len, hierarchical, kept
        if hierarchical is not None:  # (keys, values, hierarchical, S_max, layer_stride) as the C functions take them
            self._arguments = (ffi.NULL, ffi.NULL, hierarchical, max_len, 0)
        else:
            self._arguments = (pointer(keys), pointer(values), ffi.NULL, max_len, keys.stride(0))

    @classmethod
    def hierarchical_cache(cls, keys: tuple, values: tuple, draft: bool, key_scales: torch.Tensor | None,
                           max_len: int) -> "KernelCache":
        """A hierarchical cache (csrc/kv_hierarchical.c) from the keys' and the values' planes, each (upper, lower,
        step, low) tensors (L, Hkv, S_max, Dh/2) uint8 twice, then (L, Hkv, S_max) float16 twice; `draft` reads the
        upper planes alone; key_scales (L, Hkv, Dh) float32 powers of two, or None."""
        planes = [dict(zip(("upper", "lower", "step", "low"), map(pointer, store))) for store in (keys, values)]
        view = ffi.new("HierarchicalCache *", {"keys": planes[0], "values": planes[1], "draft": int(draft),
                                               "key_scales": pointer(key_scales)})
        return cls(None, None, max_len, view, kept=(keys, values, key_scales))

    def arguments(self) -> tuple:
        return self._arguments

    @property
    def quantized(self) -> int:
        """1 for a hierarchical cache (a call dequantizes its rows into scratch), 0 for float32: the C side's flag."""
        return int(self.hierarchical is not None)


def layer_weights(rows: list[dict]) -> object:
    """The C table of the layers' weights (LayerWeights[L]) from each layer's tensors by slot name (SLOTS; None where
    absent). The tensors must outlive the table's use."""
    table = ffi.new("LayerWeights[]", len(rows))
    for layer, row in zip(table, rows):
        for slot, tensor in row.items():
            layer.slots[CONSTANTS["SLOT_" + slot.upper()]] = pointer(tensor)
    return table


class LayerViews:
    """A model's layers as ModelViews read them (a LayerTable, records.py): the C table of their weights, each layer's
    window and rotary offset, and what they compute (the view's rotary dims, scale, activation). view() makes a
    ModelView of them, with the ends of a whole pass when given. Holds every array the views point at; the tensors
    of the table and of the ends must outlive the views' use.

    `shape`: the model's shape record (hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
    rms_norm_eps). A layer reads rotary table rope_tables[l] of a position's row (the tables side by side, each
    rotary_dim wide: the model's rope(), edge/kernels/runner.py)."""

    def __init__(self, shape, table: LayerTable, layer_format: str) -> None:
        rotary = table.rotary_dim or shape.head_dim
        tables = table.rope_tables or [0] * len(table.tensors)
        self.weights = layer_weights(table.tensors)  # LayerWeights[L]
        self.windows = torch.tensor(table.windows, dtype=torch.int64)  # (L,) 0: none
        self.rope_offsets = torch.tensor([kind * rotary for kind in tables], dtype=torch.int64)  # (L,)
        self._fields = {
            "D": shape.hidden_size, "H": shape.num_heads, "Hkv": shape.num_kv_heads, "Dh": shape.head_dim,
            "I": shape.intermediate_size, "R": rotary, "rope_stride": rotary * (max(tables) + 1),
            "eps": shape.rms_norm_eps, "scale": table.scale or shape.head_dim ** -0.5,
            "activation": ACTIVATIONS[table.activation], "format": weight_format(layer_format),
            "layers": self.weights, "windows": pointer(self.windows), "rope_offsets": pointer(self.rope_offsets)}

    def view(self, ends: ModelEnds | None = None) -> object:
        """A ModelView of the layers, with `ends` (embedding, final norm, head) for a whole pass or a draft."""
        fields = dict(self._fields)
        if ends is not None:
            embed, norm, head = ends.embed, ends.norm, ends.head
            fields.update(V=head.rows, head=pointer(head.weight), head_format=weight_format(head.format),
                          embed=pointer(embed), embed_format=weight_format(ends.embedding_format),
                          norm=pointer(norm), norm_format=weight_format(norm.dtype),
                          embed_scale=ends.embed_scale or 0.0, softcap=ends.softcap or 0.0)
        return ffi.new("ModelView *", fields)


class CpuKernel:
    """The whole CPU kernel library of one path: the matmuls in every weight format, the attention, the fused passes
    (layers, a whole step, a greedy draft) and the hierarchical cache's store, each a call into C."""

    def __init__(self, library) -> None:
        """`library`: the path's library opened by ffi.dlopen."""
        self.library = library
        self.threads: int | None = None  # None: torch's thread count at each call
        self._kept = threading.local()  # this thread's scratch for passes of a few rows (_scratch)
        self.path: str = ffi.string(library.kernel_path()).decode()
        self._matmul = library.rowwise_matmul  # looked up once: the hot path's calls skip the library's lookup

    @staticmethod
    def load() -> "CpuKernel | None":
        """The kernel on EDGE_CPU_KERNEL's path or this CPU's best one, or None where it cannot be built (or
        EDGE_ROWWISE_MATMUL=0). A forced path this CPU cannot run raises cpu_paths.KernelPathError."""
        if os.environ.get("EDGE_ROWWISE_MATMUL", "1") == "0":
            return None
        return CpuKernel.for_path(cpu_paths.choose_path())

    @staticmethod
    @lru_cache(maxsize=None)
    def for_path(path: str) -> "CpuKernel | None":
        """The kernel built for one path (cpu_paths.PATHS), or None where it cannot be built."""
        try:
            return CpuKernel.open(cpu_paths.build(path))
        except (OSError, subprocess.SubprocessError) as error:
            log.info("batch-invariant CPU matmul unavailable (%s); using torch's matmul", error)
            return None

    @staticmethod
    def open(library_file) -> "CpuKernel":
        """The kernel of one built library file."""
        return CpuKernel(ffi.dlopen(str(library_file)))

    def thread_count(self) -> int:
        return self.threads or torch.get_num_threads()

    def with_threads(self, threads: int) -> "CpuKernel":
        """The same kernels on a fixed number of threads (a drafter beside another runtime's threads uses 1, so the
        two thread pools do not spin against each other on a machine with few cores)."""
        bound = copy.copy(self)
        bound.threads = threads
        return bound

    def _scratch(self, rows: int, floats: int) -> torch.Tensor:
        """Scratch floats for one call. Passes of at most ROWWISE_MAX_ROWS rows (decode steps, verify passes, drafts)
        reuse this thread's buffer, grown as needed: a fresh megabyte-sized buffer each step costs the step its page
        faults (about 3% of a 4-row pass of a 500M model). Longer passes (prompt chunks) get their own."""
        if rows > ROWWISE_MAX_ROWS:
            return torch.empty(floats, dtype=torch.float32)
        kept = getattr(self._kept, "buffer", None)
        if kept is None or kept.numel() < floats:
            kept = self._kept.buffer = torch.empty(floats, dtype=torch.float32)
        return kept

    def supports(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
        return (weight.device.type == "cpu" and weight.dtype in FLOAT_FORMATS and weight.is_contiguous()
                and (bias is None or bias.dtype == torch.float32))

    # ---- one matmul, attention or norm at a time ----------------------------------------------------------------

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32, weight (N, K) float32/bfloat16/float16 contiguous, bias (N,) float32 -> (..., N) float32.

        The hot path of every decode step: no checks beyond what the caller (edge.model.transformer.linear)
        guarantees."""
        if x.dtype != torch.float32:
            raise TypeError(f"rowwise matmul takes float32 inputs, got {x.dtype}")
        return self._rowwise(x, pointer(weight), weight.shape[0], weight_format(weight.dtype), bias)

    def quantized(self, x: torch.Tensor, packed: torch.Tensor, fmt: str, out_features: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32 through weights packed by edge/kernels/cpu_packing.py in `fmt` ("int8") -> (..., N)
        float32; activations quantized per row, batch-invariant like the float kernels."""
        return self._rowwise(x, pointer(packed), out_features, weight_format(fmt), bias)

    def blocks(self, x: torch.Tensor, matrix, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32 through a BlockMatrix (edge/kernels/block_formats.py) -> (..., N) float32; activations
        quantized to 8 bits per block as llama.cpp does, batch-invariant like the other formats."""
        return self._rowwise(x, pointer(matrix.table_entry), matrix.rows, CONSTANTS["WEIGHTS_BLOCKS"], bias)

    def _rowwise(self, x: torch.Tensor, weight, out_features: int, fmt: int, bias: torch.Tensor | None) -> torch.Tensor:
        """x (..., K) float32 through `weight` (a pointer to weights in WeightFormat `fmt`) -> (..., N) float32."""
        in_features = x.shape[-1]
        if not x.is_contiguous():
            x = x.contiguous()
        out = torch.empty((*x.shape[:-1], out_features), dtype=torch.float32)  # (..., N)
        self._matmul(pointer(x), weight, pointer(bias), pointer(out), x.numel() // in_features, out_features,
                     in_features, fmt, self.thread_count())
        return out

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                  window: int | None) -> torch.Tensor:
        """q (1, H, T, Dh) at positions [start, start+T) over keys/values (1, Hkv, S_max, Dh) -> (1, H, T, Dh).

        Causal (and sliding-window) attention, each query computed alone: batch-invariant like the matmul."""
        _, heads, steps, head_dim = q.shape
        q = q.contiguous()
        if keys.stride(-1) != 1 or keys.stride(-2) != head_dim or values.stride() != keys.stride():
            raise ValueError("keys and values must be (1, Hkv, S, Dh) with contiguous rows")
        out = torch.empty_like(q)  # (1, H, T, Dh)
        scratch = torch.empty(heads * steps * (start + steps), dtype=torch.float32)  # (H, T, start + T)
        self.library.rowwise_attention_f32(pointer(q), pointer(keys), pointer(values), pointer(out), pointer(scratch),
                                           heads, keys.shape[1], steps, head_dim, keys.stride(1), start, window or 0,
                                           head_dim ** -0.5, self.thread_count())
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x (T, D) float32 contiguous, weight (D,) float32/bfloat16/float16 -> RMSNorm(x) (T, D) float32."""
        out = torch.empty_like(x)  # (T, D)
        self.library.rms_norm_f32(pointer(x), pointer(weight), pointer(out), x.shape[0], x.shape[1], eps,
                                  weight_format(weight.dtype))
        return out

    # ---- whole passes over a ModelView (LayerViews.view()) ------------------------------------------------------

    def layers(self, x: torch.Tensor, view, order: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               cache: KernelCache, start: int, capture: LayerCapture | None = None) -> None:
        """Layers `order` (int64) of `view` over x (T, D) in place, in one C call (fused_layers_f32): the view's
        layers and what they compute (its embedding, norm and head are unused); cos/sin (T, rope_stride) the rows'
        rotary tables (LayerViews), `cache` the whole KV cache (KernelCache); `capture` copies out the residual
        streams after the layers it names."""
        steps, library = x.shape[0], self.library
        scratch = self._scratch(steps, library.fused_layers_scratch(view, steps, start, cache.quantized))
        library.fused_layers_f32(view, pointer(x), steps, start, pointer(order), order.numel(), pointer(cos),
                                 pointer(sin), *cache.arguments(), capture_struct(capture), pointer(scratch),
                                 self.thread_count())

    def forward_step(self, view, tokens: torch.Tensor, start: int, order: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, cache: KernelCache, parents: torch.Tensor | None = None,
                     capture: LayerCapture | None = None,
                     rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step or verify pass through the whole model in one call (forward_step_f32): tokens (T,) int64 at
        positions [start, start + T) through the layers `order`, the final norm and the head -> (hidden (T, D),
        logits (T, V)) float32. cos/sin (T, rope_stride) are the rows' rotary tables, `cache` the whole KV cache
        (KernelCache); the view and its tensors must outlive the call. `parents` (T,) int64 makes the rows a token tree
        (row t continues row parents[t], -1 the cache; cos/sin then hold each row's depth position); `capture` copies
        out the residual streams after the layers it names (row t: the pass's row t, a tree's included). `rows`
        (slots, firsts), (T,) int64 each, makes the rows several sequences' (RowSlots in interface.h): row t writes
        slot slots[t] and attends to [firsts[t], slots[t]]; `start` must then be 1 + the largest slot - T."""
        steps, library = tokens.numel(), self.library
        scratch = self._scratch(steps, library.forward_step_scratch(view, steps, start, cache.quantized))
        hidden = torch.empty(steps, view.D, dtype=torch.float32)  # (T, D)
        logits = torch.empty(steps, view.V, dtype=torch.float32)  # (T, V)
        library.forward_step_f32(view, pointer(tokens), steps, start, pointer(order), order.numel(), pointer(cos),
                                 pointer(sin), *cache.arguments(), pointer(parents), row_slots_struct(rows),
                                 capture_struct(capture), pointer(hidden), pointer(logits), pointer(scratch),
                                 self.thread_count())
        return hidden, logits

    def draft_greedy(self, view, request: DraftRequest, order: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                     cache: KernelCache) -> KernelDraft:
        """`request.k` greedy draft tokens in one C call (draft_greedy_f32): the request's tokens at positions
        [start, ...) through layers `order` (int64), the norm and the head (V rows) of `view`, then one token per step;
        with the request's features (T0, D) float32 and their fusion fc (D, 2D, in the layers' format) the rows are a
        feature drafter's, and with its head's token_ids a trimmed head's rows name their tokens. rope: whole cos, sin
        tables from position 0; `cache` the drafter's KV cache (KernelCache). The view and its tensors must outlive
        the call."""
        steps, k, library = len(request.tokens), request.k, self.library
        tokens = torch.tensor(request.tokens, dtype=torch.int64)  # (T0,)
        scratch = self._scratch(steps, library.draft_greedy_scratch(view, steps, request.start, k, cache.quantized))
        out = torch.empty(k, dtype=torch.int64)  # (k,)
        second = torch.empty(k, dtype=torch.int64) if request.runners_up else None  # (k,)
        probabilities = torch.empty(k, 2, dtype=torch.float32) if request.runners_up else None  # (k, 2)
        features, fc = request.features if request.features is not None else (None, None)
        cos, sin = rope
        args = ffi.new("DraftArgs *", {
            "tokens": pointer(tokens), "features": pointer(features), "fc": pointer(fc), "order": pointer(order),
            "cos_table": pointer(cos), "sin_table": pointer(sin), "head_ids": pointer(request.head.token_ids),
            "T0": steps, "count": order.numel(), "start": request.start, "k": k,
            "stop_below": request.stop_below or 0.0, "out": pointer(out), "runners_up": pointer(second),
            "probabilities": pointer(probabilities)})
        count = library.draft_greedy_f32(view, args, *cache.arguments(), pointer(scratch), self.thread_count())
        if not request.runners_up:
            return KernelDraft(out[:count].tolist())
        return KernelDraft(out[:count].tolist(), second[:count].tolist(), probabilities[:count].tolist())

    def store_hierarchical(self, cache: KernelCache, layer: int, keys: torch.Tensor, values: torch.Tensor,
                           start: int) -> None:
        """The fused step's quantize-on-append alone (the tests hold it to edge/kernels/kv_quant.py): keys/values
        (T, Hkv, Dh) float32 into positions [start, start + T) of `layer` of a hierarchical cache."""
        steps, kv_heads, head_dim = keys.shape
        keys, values = keys.contiguous(), values.contiguous()
        self.library.hierarchical_store(cache.hierarchical, layer, pointer(keys), pointer(values), kv_heads * head_dim,
                                        steps, start, kv_heads, head_dim, cache.max_len)

    # ---- the block formats' layout (any path's library: repacking moves bits the same way on all) ------------

    def repack(self, block_type: int, file: torch.Tensor, rows: int, columns: int, packed: torch.Tensor,
               threads: int) -> None:
        """A GGUF tensor's bytes (rows of columns / B blocks) of BlockType `block_type` into packed groups."""
        self.library.blocks_repack(block_type, pointer(file), rows, columns, pointer(packed), threads)

    def dequantize_rows(self, block_type: int, packed: torch.Tensor, columns: int, first: int, count: int,
                        out: torch.Tensor) -> None:
        """Rows [first, first + count) of a packed matrix into out (count, columns) float32."""
        self.library.blocks_dequantize_rows(block_type, pointer(packed), columns, first, count, pointer(out))

    def quantize_blocks(self, block_type: int, weight: torch.Tensor, file: torch.Tensor, threads: int) -> None:
        """A float32 matrix (N, K) into `file`, the GGUF tensor layout of BlockType `block_type` (Q4_1 or Q8_0)."""
        rows, columns = weight.shape
        self.library.blocks_quantize(block_type, pointer(weight), rows, columns, pointer(file), threads)

    def read_bandwidth(self, megabytes: int = 1024, repeats: int = 5, data: torch.Tensor | None = None) -> float:
        """The machine's read bandwidth in GB/s as this path sees it: the best of `repeats` passes summing a buffer far
        larger than the caches on the kernel's threads, each thread reading its slice as 1, 2, 4 or 8 interleaved
        sequential streams (the best of those too: how many streams a core needs to reach full speed varies).
        `data`: a float32 buffer to read (a caller probing repeatedly allocates it once), else `megabytes` fresh."""
        if data is None:
            data = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
        best = float("inf")
        for _ in range(repeats):
            for streams in (1, 2, 4, 8):
                started = time.perf_counter()
                self.library.read_bandwidth_probe(pointer(data), data.numel(), self.thread_count(), streams)
                best = min(best, time.perf_counter() - started)
        return data.nbytes / best / 1e9
