"""KVCache: one preallocated buffer per model, written at positions, rolled back by moving a length.

    keys/values  (layers, batch, kv_heads, max_len, head_dim)

Nothing is reallocated or concatenated while decoding: a forward over T tokens at positions
[start, start + T) writes those slots of every layer it runs and reads slots [0, start + T). `rollback(n)`
forgets everything from position n on (rejected draft tokens, or the tail of an edited chat) by moving
`length`; the stale slots are overwritten by the next write.
"""

from __future__ import annotations

import torch

from edge.model.config import ModelConfig
from edge.kernels.cpu_kernel import KernelCache


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H, S, D)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H, S, D)
        self.max_len = max_len
        self.length = 0  # positions [0, length) hold valid entries for every layer
        self._kernel_cache: KernelCache | None = None

    @classmethod
    def for_model(cls, config: ModelConfig, max_len: int, **kwargs) -> "KVCache":
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, max_len, **kwargs)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def write(
        self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys/values (B, H, T, D) at positions [start, start+T); return views of slots [0, start+T)."""
        end = start + keys.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; writing up to {end} does not fit")
        self.keys[layer, :, :, start:end] = keys
        self.values[layer, :, :, start:end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]  # (B, H, end, D) each

    def kernel_cache(self) -> KernelCache | None:
        """This cache as edge's fused CPU step reads and writes it, or None where the step cannot (16-bit, a batch,
        not in the CPU's memory)."""
        if type(self) is not KVCache or self.keys.dtype != torch.float32 or self.keys.device.type != "cpu" \
                or self.keys.shape[1] != 1 or not self.keys.is_contiguous():
            return None
        if self._kernel_cache is None:
            self._kernel_cache = KernelCache(self.keys, self.values, self.max_len)
        return self._kernel_cache

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """Move slots start + rows[i] to start + i (rows increasing, rows[i] >= i: a token tree's accepted path)."""
        for tensor in (self.keys, self.values):
            keep_slots(tensor, start, rows)

    def rollback(self, length: int) -> None:
        """Forget positions >= length (no memory is touched)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self.length} positions")
        self.length = length

    def reset(self) -> None:
        self.length = 0


def keep_slots(tensor: torch.Tensor, start: int, rows: list[int]) -> None:
    """Along the slot axis (-2: a cache's (..., S, D), a feature buffer's (S, D)), move slot start + rows[i] to
    start + i: gathered first, then written, so a slot is read before it is overwritten."""
    source = torch.tensor(rows, device=tensor.device) + start  # (n,)
    tensor[..., start:start + len(rows), :] = tensor[..., source, :]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token sequences (how much of a cache can be kept)."""
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low]; the answer is in [low, high]
    while low < high:  # binary search with slice comparisons: log(n) comparisons done in C
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
