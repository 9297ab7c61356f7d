"""Prompt lookup: draft by copying what followed the latest earlier occurrence of the current suffix.

Model-free (no weights, no cache): the longest suffix of 1..max_ngram tokens that occurred before is looked up in an
index of n-gram -> the position right after its latest occurrence, and the tokens that followed it are proposed.
Useful where the output repeats the input: retrieval-augmented answers, summaries, code edits.
"""

from __future__ import annotations

from edge.decoding.drafters.base import Draft, DraftSampler
from edge.errors import SamplingError


class NGramDrafter:
    name = "ngram"
    pausable = False  # proposes only where the context repeats, at no cost where it does not (DraftLength.update)

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise SamplingError(f"n-gram sizes need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._indexed: list[int] = []  # the sequence the index describes
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence

    def propose(self, tokens: list[int], k: int, sampler: DraftSampler) -> Draft:
        size, follow = self.match(tokens)
        return Draft(tokens=tokens[follow : follow + k] if size else [])

    def match(self, tokens: list[int]) -> tuple[int, int]:
        """The longest suffix of `tokens` (max_ngram down to min_ngram tokens) that occurred before: its length and
        the position right after its latest occurrence; (0, 0) where none did."""
        self._update(tokens)
        for size in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            follow = self._index.get(tuple(tokens[-size:]))
            if follow is not None:
                return size, follow
        return 0, 0

    def _update(self, tokens: list[int]) -> None:
        """Index every n-gram that ends before the last token (the suffix itself is never its own match)."""
        done = len(self._indexed)
        if tokens[:done] != self._indexed:
            self._index, done = {}, 0  # a different conversation: rebuild
        for end in range(max(done, 1), len(tokens)):  # an n-gram ending at `end` is followed by tokens[end]
            for size in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._index[tuple(tokens[end - size : end])] = end
        self._indexed = list(tokens)  # n-grams ending at len(tokens) are indexed once a token follows them

    def observe(self, accepted: int, drafted: int, step_s: float = 0.0) -> None:
        pass

    def reset(self) -> None:
        self._indexed, self._index = [], {}

    def fresh(self) -> "NGramDrafter":
        """Another drafter with these settings for another sequence (its index is its own)."""
        return NGramDrafter(self.max_ngram, self.min_ngram)

    def memory_bytes(self) -> int:
        return 0
