"""The batch-invariant CPU matmul and attention (csrc/rowwise_matmul.c): built with the system C compiler on first
use, cached, and called through ctypes. `RowwiseMatmul.load()` returns None where it cannot be built (no C compiler
with OpenMP); callers then use torch's matmul, which is fast but not batch-invariant.

    matmul = RowwiseMatmul.load()
    y = matmul(x, weight, bias)        # x (..., K) float32, weight (N, K) float32/bfloat16/float16 -> (..., N) float32

The cache folder is $EDGE_CACHE_DIR/kernels (default: the platform's user cache folder, ~/.cache/edge/kernels);
the library's name hashes the source, the compiler and the CPU's feature flags, so a changed source or another
CPU builds afresh. Set EDGE_ROWWISE_MATMUL=0 to turn the kernel off.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "rowwise_matmul.c"
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared"]
log = logging.getLogger(__name__)
# the C side's WEIGHTS_F32 / BF16 / F16 / I8 (int8: packed matrices, float32 norms; edge/int8.py)
WEIGHT_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}


class RowwiseMatmul:
    def __init__(self, library: ctypes.CDLL) -> None:
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self.threads: int | None = None  # None: torch's thread count at each call
        self._kernels = {}
        for dtype, name in ((torch.float32, "rowwise_matmul_f32"), (torch.bfloat16, "rowwise_matmul_bf16"),
                            (torch.float16, "rowwise_matmul_f16")):
            function = getattr(library, name)
            function.argtypes = [pointer, pointer, pointer, pointer, size, size, size, ctypes.c_int]
            function.restype = None
            self._kernels[dtype] = function
        self._int8 = library.rowwise_matmul_i8
        self._int8.argtypes = [pointer, pointer, pointer, pointer, size, size, size, ctypes.c_int]
        self._int8.restype = None
        self._attention = library.rowwise_attention_f32
        self._attention.argtypes = [pointer] * 5 + [size] * 7 + [ctypes.c_float, ctypes.c_int]
        self._attention.restype = None
        self._layers = library.fused_layers_f32
        self._layers.argtypes = ([pointer, size, size, size, size, size, size, pointer, size, pointer, pointer,
                                  pointer, pointer, pointer, pointer, size, size, size, ctypes.c_float,
                                  ctypes.c_float, pointer, ctypes.c_int, ctypes.c_int])
        self._layers.restype = None
        self._norm = library.rms_norm_f32
        self._norm.argtypes = [pointer, pointer, pointer, size, size, ctypes.c_float, ctypes.c_int]
        self._norm.restype = None
        self._draft = library.draft_greedy_f32
        self._draft.argtypes = ([pointer, pointer] + [size] * 6 + [pointer, size, pointer, pointer, pointer, pointer,
                                pointer, pointer, size, size, size, ctypes.c_float, ctypes.c_float, pointer, pointer,
                                ctypes.c_int, pointer, pointer, pointer, size, ctypes.c_int, ctypes.c_int, size,
                                ctypes.c_float,
                                pointer, pointer, ctypes.c_int])
        self._draft.restype = ctypes.c_int64

    @staticmethod
    @lru_cache(maxsize=1)
    def load() -> "RowwiseMatmul | None":
        if os.environ.get("EDGE_ROWWISE_MATMUL", "1") == "0":
            return None
        try:
            return RowwiseMatmul(ctypes.CDLL(str(_build())))
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

    def supports(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
        return (weight.device.type == "cpu" and weight.dtype in self._kernels and weight.is_contiguous()
                and (bias is None or bias.dtype == torch.float32))

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) float32, weight (N, K) float32/bfloat16/float16 contiguous, bias (N,) float32 -> (..., N) float32.

        The hot path of every decode step: no checks beyond what the caller (edge.model.linear) guarantees."""
        if x.dtype != torch.float32:
            raise TypeError(f"rowwise matmul takes float32 inputs, got {x.dtype}")
        out_features, in_features = weight.shape
        if not x.is_contiguous():
            x = x.contiguous()
        out = torch.empty((*x.shape[:-1], out_features), dtype=torch.float32)  # (..., N)
        self._kernels[weight.dtype](
            x.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None, out.data_ptr(),
            x.numel() // in_features, out_features, in_features, self.thread_count(),
        )
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

    def int8(self, x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None
             ) -> torch.Tensor:
        """x (..., K) float32 through packed int8 weights (pack_int8) -> (..., N) float32; activations quantized per
        row, batch-invariant like the float kernels."""
        in_features = x.shape[-1]
        if not x.is_contiguous():
            x = x.contiguous()
        out = torch.empty((*x.shape[:-1], out_features), dtype=torch.float32)  # (..., N)
        self._int8(x.data_ptr(), packed.data_ptr(), bias.data_ptr() if bias is not None else None, out.data_ptr(),
                   x.numel() // in_features, out_features, in_features, self.thread_count())
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x (T, D) float32 contiguous, weight (D,) float32/bfloat16/float16 -> RMSNorm(x) (T, D) float32."""
        out = torch.empty_like(x)  # (T, D)
        self._norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps,
                   WEIGHT_FORMATS[weight.dtype])
        return out

    def layers(self, x: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, windows: torch.Tensor,
               shape: tuple, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               start: int, eps: float, scale: float, weight_dtype: torch.dtype = torch.float32) -> None:
        """Layers `order` (int64) over x (T, D) in place, in one C call (fused_layers_f32): `weights` is the int64
        table (L, 12) of the layers' pointers (0 for absent tensors), `windows` (L,) int64 the sliding windows (0:
        none), keys/values the whole cache (L, 1, Hkv, S, Dh), contiguous; `weight_dtype` the layers' matrices and norms
        (float32, or bfloat16 / float16 widened exactly in registers)."""
        steps = x.shape[0]
        dims, heads, kv_heads, head_dim, inner = shape
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        scratch = torch.empty(steps * (dims + 2 * q_size + q_size + 2 * kv_size + 2 * inner)
                              + heads * steps * (start + steps), dtype=torch.float32)
        self._layers(x.data_ptr(), steps, dims, heads, kv_heads, head_dim, inner, order.data_ptr(), order.numel(),
                     weights.data_ptr(), windows.data_ptr(), cos.data_ptr(), sin.data_ptr(), keys.data_ptr(),
                     values.data_ptr(), keys.shape[3], keys.stride(0), start, eps, scale, scratch.data_ptr(),
                     WEIGHT_FORMATS[weight_dtype], self.thread_count())


    def draft_greedy(self, tokens: torch.Tensor, features: torch.Tensor | None, shape: tuple, order: torch.Tensor,
                     weights: torch.Tensor, windows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     keys: torch.Tensor, values: torch.Tensor, start: int, eps: float, scale: float,
                     norm: torch.Tensor, fc: torch.Tensor | None, weight_dtype: torch.dtype, embed: torch.Tensor,
                     head: torch.Tensor, k: int, head_ids: torch.Tensor | None = None,
                     stop_below: float | None = None, head_rows: int | None = None) -> list[int]:
        """k greedy draft tokens in one C call (draft_greedy_f32): `tokens` (T0,) int64 at positions [start, ...)
        (with `features` (T0, D) float32 and the fusion `fc` (D, 2D) for a feature drafter), then one token per
        step. cos/sin are whole rotary tables from position 0; `norm`, `fc` and the layers are in `weight_dtype`,
        `embed` and `head` (V', D) in theirs (a head packed by pack_int8 is uint8 and needs `head_rows`);
        keys/values the drafter's cache (L, 1, Hkv, S, Dh), contiguous.
        `head_ids` (V',) int64: the token id of each head row, for a trimmed head (None: row v is token v).
        `stop_below`: stop before a token (not the first) whose probability is below it; fewer than k come back."""
        steps = tokens.numel()
        dims, heads, kv_heads, head_dim, inner = shape
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        packed = head.dtype == torch.uint8
        vocab = head_rows if packed else head.shape[0]
        scratch = torch.empty(steps * (4 * dims + 3 * q_size + 2 * kv_size + 2 * inner)
                              + heads * steps * (start + steps + k) + dims + vocab, dtype=torch.float32)
        out = torch.empty(k, dtype=torch.int64)
        count = self._draft(
            tokens.data_ptr(), features.data_ptr() if features is not None else None, steps, dims, heads, kv_heads,
            head_dim, inner, order.data_ptr(), order.numel(), weights.data_ptr(), windows.data_ptr(), cos.data_ptr(),
            sin.data_ptr(), keys.data_ptr(), values.data_ptr(), keys.shape[3], keys.stride(0), start, eps, scale,
            norm.data_ptr(), fc.data_ptr() if fc is not None else None, WEIGHT_FORMATS[weight_dtype],
            embed.data_ptr(), head.data_ptr(), head_ids.data_ptr() if head_ids is not None else None, vocab,
            WEIGHT_FORMATS[torch.int8 if packed else head.dtype], WEIGHT_FORMATS[embed.dtype], k, stop_below or 0.0,
            out.data_ptr(), scratch.data_ptr(), self.thread_count())
        return out[:count].tolist()


INT8_GROUP = 16  # outputs per packed group (the C side's I8_GROUP)


def int8_supported(weight: torch.Tensor) -> bool:
    """Whether pack_int8 takes this (N, K) matrix: N a multiple of 16, K of 4."""
    return weight.dim() == 2 and weight.shape[0] % INT8_GROUP == 0 and weight.shape[1] % 4 == 0


def pack_int8(weight: torch.Tensor) -> torch.Tensor:
    """weight (N, K) -> the int8 kernel's packed bytes (N*K + 8N,) uint8: per output channel symmetric int8 codes
    (scale max|w| / 127) in VNNI order, then the N float32 scales and N int32 corrections 128 * sum of codes."""
    if not int8_supported(weight):
        raise ValueError(f"int8 packing needs (N, K) with N % {INT8_GROUP} == 0 and K % 4 == 0, got "
                         f"{tuple(weight.shape)}")
    rows, columns = weight.shape
    wide = weight.detach().float().cpu()  # (N, K)
    scales = wide.abs().amax(dim=1) / 127.0  # (N,)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(wide / safe[:, None]).clamp_(-127, 127).to(torch.int8)  # (N, K)
    packed = (codes.view(rows // INT8_GROUP, INT8_GROUP, columns // 4, 4)  # (groups, 16, K/4, 4)
              .permute(0, 2, 1, 3).contiguous().view(-1))  # (N*K,): group, chunk, output, 4 codes
    corrections = codes.sum(dim=1, dtype=torch.int32) * 128  # (N,) int32
    return torch.cat([packed.view(torch.uint8), scales.contiguous().view(torch.uint8),
                      corrections.contiguous().view(torch.uint8)])


def unpack_int8(packed: torch.Tensor, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 codes (N, K) and float32 scales (N,) of a packed matrix (codes * scales[:, None] is what it stands
    for)."""
    codes = (packed[:rows * columns].view(torch.int8).view(rows // INT8_GROUP, columns // 4, INT8_GROUP, 4)
             .permute(0, 2, 1, 3).reshape(rows, columns))  # (N, K)
    scales = packed[rows * columns:rows * columns + 4 * rows].view(torch.float32)  # (N,)
    return codes, scales


def _build() -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise OSError("no C compiler found (install gcc, or set CC)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), compiler, version, " ".join(FLAGS), platform.machine(),
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    folder = _cache_dir()
    library = folder / f"rowwise_matmul-{key}.so"
    if library.is_file():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(handle)
    try:
        result = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", temporary], capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            raise OSError(f"{compiler} failed: {result.stderr.strip().splitlines()[-1] if result.stderr else ''}")
        os.replace(temporary, library)  # atomic: concurrent builders never load a half-written library
    finally:
        Path(temporary).unlink(missing_ok=True)
    return library


def _cache_dir() -> Path:
    root = os.environ.get("EDGE_CACHE_DIR")
    if root:
        return Path(root) / "kernels"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("edge", appauthor=False)) / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()
