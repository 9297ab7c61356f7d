"""The batch-invariant CPU matmul and attention (csrc/): built for this CPU's path on first use (edge/kernels/cpu_paths.py),
cached, and called through ctypes. `RowwiseMatmul.load()` returns None where it cannot be built (no C compiler with
OpenMP); callers then use torch's matmul, which is fast but not batch-invariant.

    matmul = RowwiseMatmul.load()      # the best path here, or EDGE_CPU_KERNEL's
    matmul.path                        # "avx2", "avx512-vnni", "neon-dotprod", "portable", ...
    y = matmul(x, weight, bias)        # x (..., K) float32, weight (N, K) float32/bfloat16/float16 -> (..., N) float32
    y = matmul.quantized(x, packed, "int8", N, bias)   # packed by edge/kernels/cpu_packing.py
    y = matmul.blocks(x, matrix, bias)                 # llama.cpp's block formats (edge/kernels/block_formats.py)

Set EDGE_ROWWISE_MATMUL=0 to turn the kernel off.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import os
import subprocess
import threading
from functools import lru_cache

import torch

from edge.kernels import cpu_paths
from edge.kernels.records import FLOAT_FORMATS, WEIGHT_FORMATS, DraftRequest, KernelDraft, weight_format

log = logging.getLogger(__name__)
ROWWISE_MAX_ROWS = 16  # decode steps and verify passes (k + 1 <= 13 by default) use the batch-invariant matmul


class ModelView(ctypes.Structure):
    """A model as the C calls read it beside its rows and cache (csrc/layers.c ModelView): every fused entry point
    takes it. The tensors behind the pointers must outlive every call that is given it (edge/kernels/fused_model.py keeps
    them)."""

    _fields_ = [("D", ctypes.c_int64), ("H", ctypes.c_int64), ("Hkv", ctypes.c_int64), ("Dh", ctypes.c_int64),
                ("I", ctypes.c_int64), ("V", ctypes.c_int64), ("eps", ctypes.c_float), ("scale", ctypes.c_float),
                ("format", ctypes.c_int32), ("embed_format", ctypes.c_int32), ("norm_format", ctypes.c_int32),
                ("head_format", ctypes.c_int32), ("weights", ctypes.c_void_p), ("windows", ctypes.c_void_p),
                ("embed", ctypes.c_void_p), ("norm", ctypes.c_void_p), ("head", ctypes.c_void_p)]


class DraftArgs(ctypes.Structure):
    """One greedy draft's rows, layers, rotary tables, length, stop and outputs as draft_greedy_f32 reads them
    (csrc/layers.c DraftArgs); filled from a DraftRequest by RowwiseMatmul.draft_greedy."""

    _fields_ = [("tokens", ctypes.c_void_p), ("features", ctypes.c_void_p), ("fc", ctypes.c_void_p),
                ("order", ctypes.c_void_p), ("cos_table", ctypes.c_void_p), ("sin_table", ctypes.c_void_p),
                ("head_ids", ctypes.c_void_p), ("T0", ctypes.c_int64), ("count", ctypes.c_int64),
                ("start", ctypes.c_int64), ("k", ctypes.c_int64), ("stop_below", ctypes.c_float),
                ("out", ctypes.c_void_p), ("runners_up", ctypes.c_void_p), ("probabilities", ctypes.c_void_p)]


class HierarchicalPlanes(ctypes.Structure):
    """Keys or values of a hierarchical KV cache (csrc/simd.h): nibble planes (L, Hkv, S, Dh/2), float16 step/low."""

    _fields_ = [("upper", ctypes.c_void_p), ("lower", ctypes.c_void_p), ("step", ctypes.c_void_p),
                ("low", ctypes.c_void_p)]


class HierarchicalCache(ctypes.Structure):
    """QuantSpec's hierarchical KV cache as the fused step reads and writes it (csrc/kv_hierarchical.c); `draft` reads
    the upper planes alone; `key_scales` divide keys per channel before they are quantized. The tensors behind the
    pointers must outlive every call that is given it."""

    _fields_ = [("keys", HierarchicalPlanes), ("values", HierarchicalPlanes), ("draft", ctypes.c_int32),
                ("key_scales", ctypes.c_void_p)]  # (L, Hkv, Dh) float32 powers of two, or None


class KernelCache:
    """The KV cache a fused call reads and writes: float32 keys/values (L, 1, Hkv, S, Dh), or a hierarchical one."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None, max_len: int,
                 hierarchical: HierarchicalCache | None = None) -> None:
        self.keys, self.values, self.max_len, self.hierarchical = keys, values, max_len, hierarchical

    def arguments(self) -> tuple:
        """(keys, values, hierarchical, S_max, layer_stride) as the C functions take them."""
        if self.hierarchical is not None:
            return None, None, ctypes.byref(self.hierarchical), self.max_len, 0
        return self.keys.data_ptr(), self.values.data_ptr(), None, self.max_len, self.keys.stride(0)

    @property
    def quantized(self) -> int:
        """1 for a hierarchical cache (a call dequantizes its rows into scratch), 0 for float32: the C side's flag."""
        return int(self.hierarchical is not None)


class RowwiseMatmul:
    def __init__(self, library: ctypes.CDLL) -> None:
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self.threads: int | None = None  # None: torch's thread count at each call
        self._kept = threading.local()  # this thread's scratch for passes of a few rows (_scratch)
        self.library = library
        library.kernel_path.restype = ctypes.c_char_p
        self.path: str = library.kernel_path().decode()
        self._matmul = library.rowwise_matmul
        self._matmul.argtypes = [pointer, pointer, pointer, pointer, size, size, size, ctypes.c_int, ctypes.c_int]
        self._matmul.restype = None
        self._attention = library.rowwise_attention_f32
        self._attention.argtypes = [pointer] * 5 + [size] * 7 + [ctypes.c_float, ctypes.c_int]
        self._attention.restype = None
        view, cache = ctypes.POINTER(ModelView), [pointer, pointer, pointer, size, size]  # keys .. layer_stride
        self._layers = library.fused_layers_f32
        self._layers.argtypes = [view, pointer, size, size, pointer, size, pointer, pointer, *cache, pointer,
                                 ctypes.c_int]
        self._layers.restype = None
        self._norm = library.rms_norm_f32
        self._norm.argtypes = [pointer, pointer, pointer, size, size, ctypes.c_float, ctypes.c_int]
        self._norm.restype = None
        self._draft = library.draft_greedy_f32
        self._draft.argtypes = [view, ctypes.POINTER(DraftArgs), *cache, pointer, ctypes.c_int]
        self._draft.restype = ctypes.c_int64
        self._step = library.forward_step_f32
        self._step.argtypes = [view, pointer, size, size, pointer, size, pointer, pointer, *cache, pointer, pointer,
                               pointer, pointer, ctypes.c_int]
        self._step.restype = None
        # each fused entry point's scratch floats, from the C side that carves it (csrc/layers.c *_scratch)
        self._layers_scratch = library.fused_layers_scratch
        self._step_scratch = library.forward_step_scratch
        self._draft_scratch = library.draft_greedy_scratch
        for function in (self._layers_scratch, self._step_scratch):
            function.argtypes, function.restype = [view, size, size, ctypes.c_int], size
        self._draft_scratch.argtypes, self._draft_scratch.restype = [view, size, size, size, ctypes.c_int], size
        self._store_hierarchical = library.hierarchical_store
        self._store_hierarchical.argtypes = [ctypes.POINTER(HierarchicalCache), size, pointer, pointer] + [size] * 6
        self._store_hierarchical.restype = None
        self._bandwidth = library.read_bandwidth_probe
        self._bandwidth.argtypes = [pointer, size, ctypes.c_int, ctypes.c_int]
        self._bandwidth.restype = ctypes.c_double

    @staticmethod
    def load() -> "RowwiseMatmul | None":
        """The kernel on EDGE_CPU_KERNEL's path or this CPU's best one, or None where it cannot be built (or
        EDGE_ROWWISE_MATMUL=0). A forced path this CPU cannot run raises cpu_paths.KernelPathError."""
        if os.environ.get("EDGE_ROWWISE_MATMUL", "1") == "0":
            return None
        return RowwiseMatmul.for_path(cpu_paths.choose_path())

    @staticmethod
    @lru_cache(maxsize=None)
    def for_path(path: str) -> "RowwiseMatmul | None":
        """The kernel built for one path (cpu_paths.PATHS), or None where it cannot be built."""
        try:
            return RowwiseMatmul(ctypes.CDLL(str(cpu_paths.build(path))))
        except (OSError, subprocess.SubprocessError) as error:
            log.info("batch-invariant CPU matmul unavailable (%s); using torch's matmul", error)
            return None

    def thread_count(self) -> int:
        return self.threads or torch.get_num_threads()

    def with_threads(self, threads: int) -> "RowwiseMatmul":
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

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32, weight (N, K) float32/bfloat16/float16 contiguous, bias (N,) float32 -> (..., N) float32.

        The hot path of every decode step: no checks beyond what the caller (edge.model.transformer.linear)
        guarantees."""
        if x.dtype != torch.float32:
            raise TypeError(f"rowwise matmul takes float32 inputs, got {x.dtype}")
        out_features, in_features = weight.shape
        if not x.is_contiguous():
            x = x.contiguous()
        out = torch.empty((*x.shape[:-1], out_features), dtype=torch.float32)  # (..., N)
        self._matmul(x.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None, out.data_ptr(),
                     x.numel() // in_features, out_features, in_features, weight_format(weight.dtype),
                     self.thread_count())
        return out

    def quantized(self, x: torch.Tensor, packed: torch.Tensor, fmt: str, out_features: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32 through weights packed by edge/kernels/cpu_packing.py in `fmt` ("int8") -> (..., N) float32;
        activations quantized per row, batch-invariant like the float kernels."""
        in_features = x.shape[-1]
        if not x.is_contiguous():
            x = x.contiguous()
        out = torch.empty((*x.shape[:-1], out_features), dtype=torch.float32)  # (..., N)
        self._matmul(x.data_ptr(), packed.data_ptr(), bias.data_ptr() if bias is not None else None, out.data_ptr(),
                     x.numel() // in_features, out_features, in_features, WEIGHT_FORMATS[fmt], self.thread_count())
        return out

    def blocks(self, x: torch.Tensor, matrix, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32 through a BlockMatrix (edge/kernels/block_formats.py) -> (..., N) float32; activations
        quantized to 8 bits per block as llama.cpp does, batch-invariant like the other formats."""
        if not x.is_contiguous():
            x = x.contiguous()
        out = torch.empty((*x.shape[:-1], matrix.rows), dtype=torch.float32)  # (..., N)
        self._matmul(x.data_ptr(), matrix.address, bias.data_ptr() if bias is not None else None, out.data_ptr(),
                     x.numel() // matrix.columns, matrix.rows, matrix.columns, WEIGHT_FORMATS["blocks"],
                     self.thread_count())
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
        scratch = torch.empty(heads * steps * (start + steps), dtype=torch.float32)
        self._attention(q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), scratch.data_ptr(),
                        heads, keys.shape[1], steps, head_dim, keys.stride(1), start, window or 0,
                        head_dim ** -0.5, self.thread_count())
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x (T, D) float32 contiguous, weight (D,) float32/bfloat16/float16 -> RMSNorm(x) (T, D) float32."""
        out = torch.empty_like(x)  # (T, D)
        self._norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps,
                   weight_format(weight.dtype))
        return out

    def layers(self, x: torch.Tensor, view: ModelView, order: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               cache: KernelCache, start: int) -> None:
        """Layers `order` (int64) of `view` over x (T, D) in place, in one C call (fused_layers_f32): the view's
        weights table (L, 12) of the layers' pointers, windows and format (its embedding, norm and head are unused);
        cos/sin (T, Dh) the rows' rotary tables, `cache` the whole KV cache (KernelCache)."""
        steps, view_ref = x.shape[0], ctypes.byref(view)
        scratch = self._scratch(steps, self._layers_scratch(view_ref, steps, start, cache.quantized))
        self._layers(view_ref, x.data_ptr(), steps, start, order.data_ptr(), order.numel(), cos.data_ptr(),
                     sin.data_ptr(), *cache.arguments(), scratch.data_ptr(), self.thread_count())

    def forward_step(self, view: ModelView, tokens: torch.Tensor, start: int, order: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, cache: KernelCache,
                     parents: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step or verify pass through the whole model in one call (forward_step_f32): tokens (T,) int64 at
        positions [start, start + T) through the layers `order`, the final norm and the head -> (hidden (T, D),
        logits (T, V)) float32. cos/sin (T, Dh) are the rows' rotary tables, `cache` the whole KV cache (KernelCache);
        the view (ModelView) and its tensors must outlive the call. `parents` (T,) int64 makes the rows a token tree
        (row t continues row parents[t], -1 the cache; cos/sin then hold each row's depth position)."""
        steps, view_ref = tokens.numel(), ctypes.byref(view)
        scratch = self._scratch(steps, self._step_scratch(view_ref, steps, start, cache.quantized))
        hidden = torch.empty(steps, view.D, dtype=torch.float32)  # (T, D)
        logits = torch.empty(steps, view.V, dtype=torch.float32)  # (T, V)
        self._step(view_ref, tokens.data_ptr(), steps, start, order.data_ptr(), order.numel(),
                   cos.data_ptr(), sin.data_ptr(), *cache.arguments(),
                   parents.data_ptr() if parents is not None else None, hidden.data_ptr(), logits.data_ptr(),
                   scratch.data_ptr(), self.thread_count())
        return hidden, logits

    def draft_greedy(self, view: ModelView, request: DraftRequest, order: torch.Tensor,
                     rope: tuple[torch.Tensor, torch.Tensor], cache: KernelCache) -> KernelDraft:
        """`request.k` greedy draft tokens in one C call (draft_greedy_f32): the request's tokens at positions
        [start, ...) through layers `order` (int64), the norm and the head (V rows) of `view`, then one token per step;
        with the request's features (T0, D) float32 and their fusion fc (D, 2D, in the layers' format) the rows are a
        feature drafter's, and with its head's token_ids a trimmed head's rows name their tokens. rope: whole cos, sin
        tables from position 0; `cache` the drafter's KV cache (KernelCache). The view and its tensors must outlive
        the call."""
        steps, k, view_ref = len(request.tokens), request.k, ctypes.byref(view)
        tokens = torch.tensor(request.tokens, dtype=torch.int64)  # (T0,)
        scratch = self._scratch(steps, self._draft_scratch(view_ref, steps, request.start, k, cache.quantized))
        out = torch.empty(k, dtype=torch.int64)
        second = torch.empty(k, dtype=torch.int64) if request.runners_up else None
        probabilities = torch.empty(k, 2, dtype=torch.float32) if request.runners_up else None
        features, fc = request.features if request.features is not None else (None, None)
        head_ids = request.head.token_ids
        cos, sin = rope
        args = DraftArgs(tokens=tokens.data_ptr(), features=_address(features), fc=_address(fc),
                         order=order.data_ptr(), cos_table=cos.data_ptr(), sin_table=sin.data_ptr(),
                         head_ids=_address(head_ids), T0=steps, count=order.numel(), start=request.start, k=k,
                         stop_below=request.stop_below or 0.0, out=out.data_ptr(), runners_up=_address(second),
                         probabilities=_address(probabilities))
        count = self._draft(view_ref, ctypes.byref(args), *cache.arguments(), scratch.data_ptr(), self.thread_count())
        if not request.runners_up:
            return KernelDraft(out[:count].tolist())
        return KernelDraft(out[:count].tolist(), second[:count].tolist(), probabilities[:count].tolist())

    def store_hierarchical(self, cache: KernelCache, layer: int, keys: torch.Tensor, values: torch.Tensor,
                           start: int) -> None:
        """The fused step's quantize-on-append alone (the tests hold it to edge/kernels/kv_quant.py): keys/values
        (T, Hkv, Dh) float32 into positions [start, start + T) of `layer` of a hierarchical cache."""
        steps, kv_heads, head_dim = keys.shape
        keys, values = keys.contiguous(), values.contiguous()
        self._store_hierarchical(ctypes.byref(cache.hierarchical), layer, keys.data_ptr(), values.data_ptr(),
                                 kv_heads * head_dim, steps, start, kv_heads, head_dim, cache.max_len)

    def read_bandwidth(self, megabytes: int = 1024, repeats: int = 5, data: torch.Tensor | None = None) -> float:
        """The machine's read bandwidth in GB/s as this path sees it: the best of `repeats` passes summing a buffer far
        larger than the caches on the kernel's threads, each thread reading its slice as 1, 2, 4 or 8 interleaved
        sequential streams (the best of those too: how many streams a core needs to reach full speed varies).
        `data`: a float32 buffer to read (a caller probing repeatedly allocates it once), else `megabytes` fresh."""
        import time

        if data is None:
            data = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
        best = float("inf")
        for _ in range(repeats):
            for streams in (1, 2, 4, 8):
                started = time.perf_counter()
                self._bandwidth(data.data_ptr(), data.numel(), self.thread_count(), streams)
                best = min(best, time.perf_counter() - started)
        return data.nbytes / best / 1e9


def _address(tensor: torch.Tensor | None) -> int | None:
    """A tensor's address for a C pointer field, None (NULL) for no tensor."""
    return tensor.data_ptr() if tensor is not None else None
