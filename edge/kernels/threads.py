"""How many threads a model's whole passes and one-call drafts take, chosen from their measured times.

A team of threads meets at a barrier several times a layer. On a machine where another process holds a core (a
browser, a build), the thread that loses its core stalls every barrier, and the whole team decodes slower than one
thread would. The governor times each fused pass (and each one-call draft, per drafted token, under a key of its
own: edge/kernels/runner.py DRAFT_ROWS), keeps a running estimate per thread count and row count, runs the
fastest, tries each other count once early on, and now and then runs one pass on another count to see whether the
machine changed (every 16 passes at first; each probe that loses doubles the interval, up to 1024, and each that
wins halves it):

    governor = ThreadGovernor(most=2)
    threads = governor.next(rows)             # the count this pass runs on
    governor.record(threads, rows, seconds)   # its measured time

On a steady machine the probes soon cost under a thousandth of the time; a machine that gets busy is found within a
few passes (the estimate of the count in use rises at once past the other's), and one that gets quiet again at the
next probe. The kernel's
results do not depend on the thread count (tests/kernels/test_kernels_cpu.py), so the choice never changes a token.
Set EDGE_ADAPTIVE_THREADS=0 to keep every pass on the full count.
"""

from __future__ import annotations

import os

SMOOTHING = 0.3  # weight of a new time in the running estimate: a busy machine's slow passes move it within two
# passes, one passing hiccup does not
MARGIN = 0.8  # another count takes over only below this share of the current one's time: noise does not flip it
PROBE_EVERY = 16  # passes between two probes of another thread count at first and after a change of count
PROBE_EVERY_MOST = 1024  # each probe that loses doubles the interval up to this (about 5 s of decoding a small model)


def candidate_counts(most: int) -> tuple[int, ...]:
    """The thread counts worth trying below `most`, largest first: `most`, its halves, 1 (2 -> (2, 1))."""
    counts, count = [], most
    while count > 1:
        counts.append(count)
        count //= 2
    return (*counts, 1)


class ThreadGovernor:
    def __init__(self, most: int, probe_every: int = PROBE_EVERY, probe_every_most: int = PROBE_EVERY_MOST) -> None:
        self.counts = candidate_counts(most)
        self.current = most
        self.first_interval, self.longest_interval = probe_every, probe_every_most
        self.probe_every = probe_every
        self._estimates: dict[tuple[int, int], float] = {}  # (threads, rows) -> seconds
        self._passes = 0
        self._probed = 0  # the index into counts of the last probe

    @staticmethod
    def enabled() -> bool:
        return os.environ.get("EDGE_ADAPTIVE_THREADS", "1") != "0"

    def next(self, rows: int) -> int:
        """The thread count the next pass of `rows` rows runs on: the current choice, or now and then a probe of
        another (each in turn)."""
        self._passes += 1
        others = [count for count in self.counts if count != self.current]
        if (self.current, rows) in self._estimates:  # each other count is tried once as soon as there is a baseline
            untried = [count for count in others if (count, rows) not in self._estimates]
            if untried:
                return untried[0]
        if not others or self._passes < self.probe_every:
            return self.current
        self._passes = 0
        self._probed = (self._probed + 1) % len(others)
        return others[self._probed]

    def record(self, threads: int, rows: int, seconds: float) -> None:
        """A pass of `rows` rows took `seconds` on `threads` threads: update its estimate, and run the count with
        the lowest estimate for this row count from now on (the current one where no other was measured)."""
        key = (threads, rows)
        known = self._estimates.get(key)
        probe = threads != self.current  # a probe's time replaces its count's estimate: the one before may be stale
        self._estimates[key] = seconds if known is None or probe else known + SMOOTHING * (seconds - known)
        measured = {count: self._estimates[(count, rows)] for count in self.counts if (count, rows) in self._estimates}
        if self.current not in measured:
            return
        fastest = min(measured, key=measured.get)
        if measured[fastest] > MARGIN * measured[self.current]:
            fastest = self.current
        if probe:  # one that wins halves the interval, one that loses doubles it
            won = fastest == threads
            self.probe_every = (max(self.probe_every // 2, self.first_interval) if won
                                else min(2 * self.probe_every, self.longest_interval))
        elif fastest != self.current:  # the count in use got slower: the machine changed, look back again soon
            self.probe_every, self._passes = self.first_interval, 0
        self.current = fastest
