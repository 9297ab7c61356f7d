"""The prompt cache's store: the longest shared prefix, entries covered by longer ones, and a bounded size."""

from __future__ import annotations

import torch

from edge.decoding.prompt_store import PromptStore

LAYERS, HEADS, DIM = 2, 1, 4
BYTES_A_TOKEN = 2 * LAYERS * HEADS * DIM * 4  # keys and values, float32


def kv(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values (L, 1, Hkv, n, Dh) that name their tokens, so a copy can be checked."""
    keys = torch.tensor(tokens, dtype=torch.float32).view(1, 1, 1, -1, 1).expand(LAYERS, 1, HEADS, -1, DIM)
    return keys.contiguous(), -keys.contiguous()


def test_the_entry_sharing_the_longest_prefix_is_found():
    store = PromptStore(capacity=1 << 20)
    store.keep([1, 2, 3, 4], *kv([1, 2, 3, 4]))
    store.keep([1, 2, 9], *kv([1, 2, 9]))
    entry, shared = store.longest([1, 2, 3, 7])
    assert shared == 3 and entry.tokens == (1, 2, 3, 4)
    assert torch.equal(entry.keys[0, 0, 0, :, 0], torch.tensor([1.0, 2, 3, 4]))
    assert store.longest([5, 1, 2]) == (None, 0)


def test_kept_tensors_are_copies():
    store = PromptStore(capacity=1 << 20)
    keys, values = kv([1, 2, 3])
    store.keep([1, 2, 3], keys, values)
    keys.zero_()
    assert store.longest([1, 2, 3])[0].keys[0, 0, 0, 2, 0] == 3.0


def test_an_entry_that_a_longer_one_extends_is_dropped_for_it():
    store = PromptStore(capacity=1 << 20)
    store.keep([1, 2], *kv([1, 2]))
    store.keep([1, 2, 3], *kv([1, 2, 3]))
    assert list(store.entries) == [(1, 2, 3)] and store.nbytes == 3 * BYTES_A_TOKEN
    store.keep([1, 2], *kv([1, 2]))  # covered by the kept one: nothing new
    assert list(store.entries) == [(1, 2, 3)] and store.nbytes == 3 * BYTES_A_TOKEN


def test_the_least_recently_used_go_first_past_the_capacity():
    store = PromptStore(capacity=6 * BYTES_A_TOKEN)
    store.keep([1, 1], *kv([1, 1]))
    store.keep([2, 2], *kv([2, 2]))
    store.longest([1, 1, 5])  # [1, 1] used: [2, 2] is now the oldest
    store.keep([3, 3, 3], *kv([3, 3, 3]))
    assert set(store.entries) == {(1, 1), (3, 3, 3)} and store.nbytes <= store.capacity
    store.keep(list(range(10)), *kv(list(range(10))))  # alone above the capacity: not kept, nothing dropped
    assert set(store.entries) == {(1, 1), (3, 3, 3)}
