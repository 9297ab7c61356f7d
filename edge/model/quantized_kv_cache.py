"""QuantizedKVCache: the KV cache stored quantized (edge/kernels/kv_quant.py), quantized once as each token is appended.

    cache = QuantizedKVCache.for_model(config, max_len, key_format="int8", value_format="int4")   # KV-AdaQuant
    cache = QuantizedKVCache.for_model(config, max_len, key_format="hierarchical", value_format="hierarchical")
    keys, values = cache.write(layer, start, k, v)     # quantize rows [start, start+T); dequantized [0, start+T)
    with cache.drafting(): ...                         # reads see the draft's view (upper 4 bits: QuantSpec)

Same interface as KVCache (length, rollback, reset, nbytes, write), so the model and every strategy run unchanged.
`cache.key_scales` (L, Hkv, Dh), powers of two from edge/model/key_scales.py, divide keys per channel before they are
quantized and multiply them back as they are read: outlier key channels then do not set every channel's step.
This is the reference path: reads dequantize the whole prefix each call. Keys may take more bits than values
(KV-AdaQuant: keys are more sensitive).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from edge.model.kv_cache import KVCache, keep_slots
from edge.kernels.cpu_kernel import KernelCache
from edge.kernels.dispatch import use_triton
from edge.kernels.kv_quant import KV_FORMATS, PackedVectors, dequantize, quantize

KV_CACHE_CHOICES = ("float32", "int8", "int8-int4", "hierarchical")  # int8-int4: int8 keys, int4 values


def kv_formats(choice: str) -> tuple[str, str]:
    if choice not in KV_CACHE_CHOICES[1:]:
        raise ValueError(f"unknown KV cache format {choice!r}; choose one of {', '.join(KV_CACHE_CHOICES)}")
    return {"int8": ("int8", "int8"), "int8-int4": ("int8", "int4"),
            "hierarchical": ("hierarchical", "hierarchical")}[choice]


class _Store:
    """Preallocated planes for one of keys/values: (layers, batch, heads, max_len, ...) each."""

    def __init__(self, kind: str, shape: tuple[int, ...], head_dim: int, device) -> None:
        if kind not in KV_FORMATS:
            raise ValueError(f"unknown KV format {kind!r}; expected one of {', '.join(KV_FORMATS)}")
        if kind in ("int4", "hierarchical") and head_dim % 2:
            raise ValueError(f"{kind} packs two values per byte, so head_dim must be even, got {head_dim}")
        self.kind = kind
        if kind == "int8":
            self.planes = (torch.zeros((*shape, head_dim), dtype=torch.int8, device=device),)
        elif kind == "int4":
            self.planes = (torch.zeros((*shape, head_dim // 2), dtype=torch.uint8, device=device),)
        else:
            self.planes = tuple(torch.zeros((*shape, head_dim // 2), dtype=torch.uint8, device=device)
                                for _ in range(2))
        self.scale = torch.zeros((*shape, 1), dtype=torch.float16, device=device)
        self.low = torch.zeros((*shape, 1), dtype=torch.float16, device=device) if kind == "hierarchical" else None

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.planes) + self.scale.nbytes + (self.low.nbytes if self.low is not None else 0)

    def write(self, layer: int, start: int, end: int, x: torch.Tensor, packer=quantize) -> None:
        """Quantize x (B, H, T, Dh) into positions [start, end) of `layer` (`packer`: the reference, or the Triton
        kernel with the same output)."""
        packed = packer(x, self.kind)
        for plane, new in zip(self.planes, packed.planes):
            plane[layer, :, :, start:end] = new
        self.scale[layer, :, :, start:end] = packed.scale
        if self.low is not None:
            self.low[layer, :, :, start:end] = packed.low

    def kernel_planes(self) -> tuple[torch.Tensor, ...]:
        """A hierarchical store's planes for the fused CPU step (batch 1, contiguous): upper, lower, step, low."""
        upper, lower = self.planes
        return upper, lower, self.scale, self.low

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """Move slots start + rows[i] to start + i of every layer: codes, scales and lows (KVCache.keep_rows)."""
        for tensor in (*self.planes, self.scale, self.low):
            if tensor is not None:
                keep_slots(tensor, start, rows)

    def packed(self, layer: int) -> PackedVectors:
        """Layer `layer`'s storage (batch 0) as PackedVectors over (Hkv, max_len, ...), for the fused kernels."""
        return PackedVectors(self.kind, tuple(p[layer, 0] for p in self.planes), self.scale[layer, 0],
                             self.low[layer, 0] if self.low is not None else None)

    def read(self, layer: int, end: int, draft: bool) -> torch.Tensor:
        packed = PackedVectors(self.kind, tuple(p[layer, :, :, :end] for p in self.planes),
                               self.scale[layer, :, :, :end],
                               self.low[layer, :, :, :end] if self.low is not None else None)
        return dequantize(packed, draft=draft).contiguous()  # (B, H, end, Dh) float32


class QuantizedKVCache(KVCache):
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, *, key_format: str = "int8",
                 value_format: str = "int8", batch: int = 1, device: torch.device | str = "cpu") -> None:
        shape = (num_layers, batch, num_kv_heads, max_len)
        self.keys_store = _Store(key_format, shape, head_dim, device)
        self.values_store = _Store(value_format, shape, head_dim, device)
        self.formats = (key_format, value_format)
        self._head_dim = head_dim
        self.max_len = max_len
        self.length = 0
        self.draft_view = False  # True while a QuantSpec draft runs: reads use the upper 4 bits only
        self._kernel_caches: dict[bool, KernelCache] = {}  # the fused step's view, for the target and the draft
        self._key_scales: torch.Tensor | None = None  # (L, Hkv, Dh) float32 powers of two, or None

    @property
    def key_scales(self) -> torch.Tensor | None:
        return self._key_scales

    @key_scales.setter
    def key_scales(self, scales: torch.Tensor | None) -> None:
        """Set before anything is written (the stored keys are divided by them)."""
        if self.length:
            raise ValueError("key scales are set on an empty cache: the stored keys are divided by them")
        shape = (self.keys_store.scale.shape[0], self.keys_store.scale.shape[2], self._head_dim)
        if scales is not None and tuple(scales.shape) != shape:
            raise ValueError(f"key scales must be (layers, kv heads, head dim) = {shape}, got {tuple(scales.shape)}")
        self._key_scales = None if scales is None else scales.to(torch.float32, copy=True).contiguous()
        self._kernel_caches.clear()  # the fused step's view holds the pointer

    def _scaled_keys(self, layer: int, keys: torch.Tensor, inverse: bool) -> torch.Tensor:
        """keys (B, Hkv, T, Dh) divided (or, `inverse`, multiplied) by layer `layer`'s scales."""
        if self._key_scales is None:
            return keys
        scales = self._key_scales[layer].to(keys.device)[None, :, None, :]  # (1, Hkv, 1, Dh)
        return keys.float() * scales if inverse else keys.float() / scales  # float32: exact for powers of two

    @property
    def nbytes(self) -> int:
        return self.keys_store.nbytes + self.values_store.nbytes

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize keys/values (B, H, T, D) into positions [start, start+T); return slots [0, start+T) dequantized
        (the draft's view inside `drafting()`)."""
        end = start + keys.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; writing up to {end} does not fit")
        self.keys_store.write(layer, start, end, self._scaled_keys(layer, keys, inverse=False))
        self.values_store.write(layer, start, end, values)
        stored = self._scaled_keys(layer, self.keys_store.read(layer, end, self.draft_view), inverse=True)
        return (stored.to(keys.dtype),  # the compute dtype (16-bit too)
                self.values_store.read(layer, end, self.draft_view).to(values.dtype))

    def keep_rows(self, start: int, rows: list[int]) -> None:
        self.keys_store.keep_rows(start, rows)
        self.values_store.keep_rows(start, rows)

    def kernel_cache(self) -> KernelCache | None:
        """A hierarchical cache in the CPU's memory as edge's fused CPU step reads and writes it (the draft's view
        inside drafting()); None for the other formats, which run the reference path."""
        if (self.formats != ("hierarchical", "hierarchical") or self.max_len == 0
                or self.keys_store.scale.device.type != "cpu" or self.keys_store.scale.shape[1] != 1):
            return None
        cached = self._kernel_caches.get(self.draft_view)
        if cached is None:
            cached = self._kernel_caches[self.draft_view] = KernelCache.hierarchical_cache(
                self.keys_store.kernel_planes(), self.values_store.kernel_planes(), self.draft_view, self._key_scales,
                self.max_len)
        return cached

    def fused_attention(self, layer: int, start: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        window: int | None) -> torch.Tensor | None:
        """Quantize-on-append and attention straight from the packed cache with the Triton kernels (a capable GPU,
        or the interpreter when asked; see edge/kernels/dispatch.py): q (1, H, T, Dh), keys/values (1, Hkv, T, Dh) ->
        (1, H, T, Dh). None where they do not apply (then write() and the model's attention run)."""
        kind = self.formats[0]
        if (window or q.shape[0] != 1 or self.formats[1] != kind or kind not in ("int8", "hierarchical")
                or not use_triton(q)):
            return None
        # edge.kernels.triton_kernels imports triton: loaded only where a GPU (or its interpreter) runs it
        from edge.kernels.triton_kernels import quantize_vectors, quantized_decode_attention

        end = start + keys.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; writing up to {end} does not fit")
        self.keys_store.write(layer, start, end, self._scaled_keys(layer, keys, inverse=False),
                              packer=quantize_vectors)
        self.values_store.write(layer, start, end, values, packer=quantize_vectors)
        if self._key_scales is not None:  # q·k = (q * s)·(k / s): each query head takes its KV head's scales
            scales = self._key_scales[layer].repeat_interleave(q.shape[1] // self._key_scales.shape[1], 0)  # (H, Dh)
            q = q * scales.to(q.device)[None, :, None, :]  # (1, H, T, Dh)
        out = quantized_decode_attention(q[0].transpose(0, 1), self.keys_store.packed(layer),
                                         self.values_store.packed(layer), start, draft=self.draft_view)  # (T, H, Dh)
        return out.transpose(0, 1)[None]  # (1, H, T, Dh)

    @contextmanager
    def drafting(self):
        """Reads inside see the draft's view of a hierarchical cache (its upper 4 bits)."""
        previous, self.draft_view = self.draft_view, True
        try:
            yield self
        finally:
            self.draft_view = previous
