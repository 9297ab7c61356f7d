"""The loop stop: a reply whose newest tokens repeat one cycle is stuck, and ends with finish reason "loop".

    detector = LoopDetector(64)
    for token in reply_tokens:
        if detector.push(token):      # the reply has looped: stop here
            break

A loop is a cycle of p tokens (1 <= p <= MAX_PERIOD) repeated, ending at the newest token, at least MIN_CYCLES times
in a row and over at least `min_tokens` tokens: the stretch [t - L + 1, t] with t[i] == t[i - p] throughout and
L >= max(min_tokens, MIN_CYCLES * p). "la femme au martyre, " six tokens long is caught after 64 tokens of it; a
paragraph of 80 tokens said over again after three of them. A short repeat (a table's "| --- | --- |", a list of the
same word a few times) is not. The check costs one comparison per period per token (vectorised).

edge's reply loop (edge/engine/reply.py) runs it over each reply's tokens as they are emitted, so plain and
speculative decoding stop at the same token; bench/everyday.py counts loops with it.
"""

from __future__ import annotations

import numpy as np

MAX_PERIOD = 256  # the longest cycle looked for, in tokens
MIN_CYCLES = 3  # a cycle must appear this many times in a row


class LoopDetector:
    """Fed one token at a time; says when the tokens so far end in a loop (see the module's docstring)."""

    def __init__(self, min_tokens: int, max_period: int = MAX_PERIOD, min_cycles: int = MIN_CYCLES) -> None:
        self.min_tokens, self.max_period, self.min_cycles = min_tokens, max_period, min_cycles
        self.recent = np.full(max_period, -1, dtype=np.int64)  # recent[p - 1]: the token p places back
        self.runs = np.zeros(max_period, dtype=np.int64)  # runs[p - 1]: how many newest tokens equal the one p back
        periods = np.arange(1, max_period + 1)
        # the run a period needs: the stretch (run + p) covers min_tokens and min_cycles cycles
        self.needed = np.maximum(min_tokens - periods, (min_cycles - 1) * periods)
        self.count = 0
        self.period: int | None = None  # the cycle's length, once a loop is found

    def push(self, token: int) -> bool:
        """Add the newest token; True when the tokens now end in a loop (and from then on)."""
        if self.period is not None:
            return True
        if self.min_tokens <= 0:
            return False
        same = (self.recent == token) & (np.arange(self.max_period) < self.count)
        self.runs = np.where(same, self.runs + 1, 0)
        self.recent[1:] = self.recent[:-1].copy()
        self.recent[0] = token
        self.count += 1
        looped = np.flatnonzero(self.runs >= self.needed)
        if looped.size:
            self.period = int(looped[0]) + 1
            return True
        return False


def loop_length(tokens: list[int], min_tokens: int) -> int | None:
    """How many tokens `tokens` holds when a loop is first found in it (None: no loop)."""
    detector = LoopDetector(min_tokens)
    for index, token in enumerate(tokens):
        if detector.push(token):
            return index + 1
    return None
