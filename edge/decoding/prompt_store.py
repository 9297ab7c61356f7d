"""Keys and values of earlier sequences kept in host memory after their slot is taken by another: a batch's prompt
cache. A new sequence whose prompt begins with one of them (a chat's next turn after its slot served someone else,
a prompt asked again, a shared system prompt) copies that prefix back instead of running it again.

    store = PromptStore(capacity=256 * 2**20)
    store.keep(tokens, keys, values)              # (L, 1, Hkv, n, Dh) each: the keys/values of tokens[:n]
    entry, shared = store.longest(prompt)        # the entry sharing the longest prefix with prompt, and its length

Entries are kept whole, least recently used first out once their bytes pass `capacity`; an entry that another
extends is dropped for it (the longer one serves every prompt the shorter one did).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from edge.model.kv_cache import common_prefix


@dataclass(frozen=True)
class StoredPrefix:
    tokens: tuple[int, ...]
    keys: torch.Tensor  # (L, 1, Hkv, n, Dh)
    values: torch.Tensor  # (L, 1, Hkv, n, Dh)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class PromptStore:
    """Up to `capacity` bytes of keys and values, by the tokens they were computed for."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[tuple[int, ...], StoredPrefix] = OrderedDict()  # least recently used first
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def keep(self, tokens: list[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep copies of `keys` and `values` (L, 1, Hkv, n, Dh: positions 0 .. n - 1 of `tokens`, n = len(tokens));
        nothing when they alone pass the capacity, or when a kept entry already begins with `tokens`."""
        key = tuple(tokens)
        if not key or keys.nbytes + values.nbytes > self.capacity:
            return
        for kept in self.entries:
            if kept[:len(key)] == key:  # already covered: a later prompt finds it there
                self.entries.move_to_end(kept)
                return
        for kept in [kept for kept in self.entries if key[:len(kept)] == kept]:  # covered by the new one
            self._drop(kept)
        entry = StoredPrefix(key, keys.clone(), values.clone())
        self.entries[key] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.capacity:
            self._drop(next(iter(self.entries)))

    def longest(self, tokens: list[int]) -> tuple[StoredPrefix | None, int]:
        """The entry sharing the longest prefix with `tokens` (now the most recently used), and that length; (None, 0)
        when none shares a token."""
        best, shared, wanted = None, 0, tuple(tokens)
        for kept, entry in self.entries.items():
            length = common_prefix(kept, wanted)
            if length > shared:
                best, shared = entry, length
        if best is not None:
            self.entries.move_to_end(best.tokens)
        return best, shared

    def _drop(self, key: tuple[int, ...]) -> None:
        self.nbytes -= self.entries.pop(key).nbytes
