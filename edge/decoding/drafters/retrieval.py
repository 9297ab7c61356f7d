"""Retrieval drafting (REST): propose what most often followed the current suffix in text the target wrote itself.

    store = read_datastore(folder, tokenizer)         # token ids of the target's own replies (python -m train.datastore)
    drafter = RetrievalDrafter(store)                 # also looks up the conversation itself, as prompt lookup does
    draft = drafter.propose(tokens, k, sampler)

A small model answers in recurring phrases: its greedy replies to thousands of requests hold the continuations it
will choose again. The store keeps those replies' token ids (uint16, a separator between replies) and a suffix
array over its first MATCH tokens: the longest suffix of the context (MATCH down to `min_match` tokens) that occurs
in it is found by binary search, and the draft follows the continuation most of its occurrences agree on, token by
token, while more than half of those still in agreement share the next token. The conversation itself is searched
as well (prompt lookup); the longer match wins. Model-free, a fraction of a millisecond a draft, so like
n-gram lookup it never pauses. Lossless like every drafter: the target verifies each proposal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edge.decoding.drafters.base import Draft, DraftSampler
from edge.decoding.drafters.ngram import NGramDrafter
from edge.errors import SamplingError

MATCH = 8  # the longest suffix looked up
SEPARATOR = np.iinfo(np.uint16).max  # between replies: never a token id (vocabularies under 65,535)
MAX_OCCURRENCES = 64  # occurrences of a suffix whose continuations are counted
STORE, CARD = "replies.npy", "card.json"  # a datastore folder's files (train/datastore.py writes them)


class TokenStore:
    def __init__(self, tokens: np.ndarray) -> None:
        """`tokens` (N,) uint16: replies one after another, each followed by SEPARATOR."""
        if tokens.dtype != np.uint16 or tokens.ndim != 1:
            raise SamplingError("a retrieval datastore holds uint16 token ids in one row")
        self.tokens = tokens
        padded = np.concatenate([tokens, np.full(MATCH, SEPARATOR, dtype=np.uint16)]).astype(np.uint64)
        # each position's next 8 tokens as two big-endian keys of 4: sorting by (high, low) sorts the suffixes
        high = sum(padded[i : i + len(tokens)] << np.uint64(16 * (3 - i)) for i in range(4))  # (N,)
        low = sum(padded[4 + i : 4 + i + len(tokens)] << np.uint64(16 * (3 - i)) for i in range(4))  # (N,)
        self.order = np.lexsort((low, high)).astype(np.int32)  # (N,) positions, sorted by their next 8 tokens
        self._high, self._low = high[self.order], low[self.order]  # (N,) each, sorted

    @classmethod
    def from_replies(cls, replies: list[list[int]]) -> "TokenStore":
        parts = []
        for reply in replies:
            if any(not 0 <= t < SEPARATOR for t in reply):
                raise SamplingError(f"token ids must be below {SEPARATOR} to go in a retrieval datastore")
            parts.append(np.asarray([*reply, SEPARATOR], dtype=np.uint16))
        return cls(np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16))

    @classmethod
    def load(cls, path: str | Path) -> "TokenStore":
        try:
            tokens = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise SamplingError(f"cannot read the retrieval datastore {path}: {error}") from None
        return cls(tokens)

    def save(self, path: str | Path) -> None:
        np.save(path, self.tokens, allow_pickle=False)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.order.nbytes + self._high.nbytes + self._low.nbytes

    def occurrences(self, suffix: list[int]) -> np.ndarray:
        """Positions right after each occurrence of `suffix` (1 to MATCH tokens), in suffix-array order."""
        first, last = _key_range(self._high, suffix[:4])
        if len(suffix) > 4:
            start, end = _key_range(self._low[first:last], suffix[4:])
            first, last = first + start, first + end
        return self.order[first:last] + len(suffix)

    def continuation(self, after: np.ndarray, k: int) -> list[int]:
        """The continuation most occurrences agree on, token by token: up to k tokens, while more than half of the
        occurrences still in agreement share the next one (a reply that ends there counts against going on)."""
        ends = np.minimum(after[:MAX_OCCURRENCES, None] + np.arange(k), len(self.tokens) - 1)  # (n, k)
        candidates = self.tokens[ends]  # (n, k): a store's last token is always SEPARATOR
        draft: list[int] = []
        for depth in range(k):
            values, counts = np.unique(candidates[:, depth], return_counts=True)
            best = int(counts.argmax())
            token = int(values[best])
            if token == SEPARATOR or 2 * int(counts[best]) <= len(candidates) and len(candidates) > 1:
                break
            draft.append(token)
            candidates = candidates[candidates[:, depth] == token]
        return draft


def _key_range(keys: np.ndarray, prefix: list[int]) -> tuple[int, int]:
    """The range of sorted 4-token keys that begin with `prefix` (1 to 4 tokens)."""
    shift = 16 * (4 - len(prefix))
    base = 0
    for token in prefix:
        base = (base << 16) | token
    lowest, highest = np.uint64(base << shift), np.uint64((base << shift) | ((1 << shift) - 1))
    return int(np.searchsorted(keys, lowest, "left")), int(np.searchsorted(keys, highest, "right"))


class RetrievalDrafter:
    name = "retrieval"
    pausable = False  # proposes only on a match, at no cost where there is none (DraftLength.update)

    def __init__(self, store: TokenStore, min_match: int = 2) -> None:
        self.store, self.min_match = store, min_match
        self.lookup = NGramDrafter(max_ngram=MATCH, min_ngram=min_match)

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        own_size, follow = self.lookup.match(tokens)  # the conversation's own longest match
        own = Draft(tokens=tokens[follow : follow + k] if own_size else [])
        shortest = max(self.min_match, own_size + 1)
        longest = min(MATCH, len(tokens))
        # the longest suffix the store holds: occurrence is monotone in length, so a binary search over lengths
        found = None
        while shortest <= longest:
            size = (shortest + longest) // 2
            after = self.store.occurrences(tokens[-size:])
            if len(after):
                found, shortest = after, size + 1
            else:
                longest = size - 1
        if found is not None:
            draft = self.store.continuation(found, k)
            if draft:
                return Draft(tokens=draft)
        return own

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        pass

    def reset(self) -> None:
        self.lookup.reset()

    def fresh(self) -> "RetrievalDrafter":
        """Another drafter over the same (read-only) datastore for another sequence: its prompt lookup is its own."""
        return RetrievalDrafter(self.store, self.min_match)

    def memory_bytes(self) -> int:
        return self.store.nbytes


def read_datastore(folder: str | Path, tokenizer) -> TokenStore:
    """The datastore in `folder`, checked to be written with `tokenizer`'s vocabulary (another one's ids would draft
    nothing the target says)."""
    folder = Path(folder)
    try:
        card = json.loads((folder / CARD).read_text())
    except (OSError, ValueError) as error:
        raise SamplingError(f"{folder} is not a retrieval datastore ({CARD}: {error}); write one with "
                            "python -m train.datastore") from None
    if card.get("vocab_sha256") != tokenizer.fingerprint()["vocab_sha256"]:
        raise SamplingError(f"the retrieval datastore {folder} was written with another tokenizer than this "
                            "model's; build one from this model's replies (python -m train.datastore)")
    return TokenStore.load(folder / STORE)
