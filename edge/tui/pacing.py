"""How often a streaming reply reaches the screen, so that rendering never holds decoding back.

Decoding runs edge's CPU kernels on a team of threads, one per core, which meet at barriers many times per token.
Whenever the app's UI thread renders (Markdown parsing, layout, compositing), it takes a core from one of them and
the whole team waits at the next barrier: on a 2-core machine every millisecond of rendering costs about a
millisecond of decoding. So the UI thread's CPU time while a reply streams is held to a small share (`duty`) of the
time the reply has been streaming: the allowance grows with the reply, an update is sent only when the allowance
covers what an update has been costing (measured on the UI thread, updates included that are still being drawn),
and never while the previous one is still being drawn. A fast model's short reply therefore appears whole when it
ends; a slow model's streams at a few updates a second.
"""

from __future__ import annotations

import os
import threading
import time

MIN_INTERVAL_S = 0.05  # at most 20 updates a second
MAX_INTERVAL_S = 2.0  # at least one update every two seconds, whatever they cost
SHARED_CORES_DUTY = 0.02  # the UI's CPU share while decoding uses every core: about 2% of decoding speed
SPARE_CORE_DUTY = 0.5  # with a core to spare the UI may render freely
FIRST_COST_S = 0.02  # what an update is assumed to cost before one has been measured


def ui_duty(kernel_threads: int, cores: int | None = None) -> float:
    """The UI's allowed CPU share: small when the decoding team uses every core, large when one is spare."""
    cores = cores or os.cpu_count() or 1
    return SPARE_CORE_DUTY if cores > kernel_threads else SHARED_CORES_DUTY


class UpdatePacer:
    """Asked on the decoding worker's thread whether to send an update now (`due`, then `sent`); told on the UI
    thread when one has been drawn (`drawn`, with the UI thread's CPU time). The cost estimate carries over from one
    reply to the next."""

    def __init__(self, duty: float, *, clock=time.perf_counter) -> None:
        self.duty, self.clock = duty, clock
        self.update_cost_s = FIRST_COST_S  # UI CPU per update, a running estimate
        self._lock = threading.Lock()
        self._in_flight = False
        self._started_at = self._last_sent_at = 0.0
        self._spent_s = 0.0  # UI CPU time spent on this reply's updates so far
        self._ui_cpu_s: float | None = None  # the UI thread's CPU time when the reply started or the last was drawn

    def start(self, ui_cpu_s: float) -> None:
        """A reply starts streaming (called on the UI thread with time.thread_time())."""
        with self._lock:
            self._in_flight, self._spent_s, self._ui_cpu_s = False, 0.0, ui_cpu_s
            self._started_at = self._last_sent_at = self.clock()

    def due(self) -> bool:
        """True when the allowance covers one more update and none is waiting to be drawn."""
        with self._lock:
            if self._in_flight:
                return False
            now = self.clock()
            since_last = now - self._last_sent_at
            allowance = self.duty * (now - self._started_at) - self._spent_s
            return since_last >= MAX_INTERVAL_S or (since_last >= MIN_INTERVAL_S and allowance >= self.update_cost_s)

    def sent(self) -> None:
        with self._lock:
            self._in_flight, self._last_sent_at = True, self.clock()

    def drawn(self, ui_cpu_s: float) -> None:
        """The UI drew an update; `ui_cpu_s` is its thread's CPU time now (time.thread_time() on the UI thread)."""
        with self._lock:
            cost = 0.0 if self._ui_cpu_s is None else max(0.0, ui_cpu_s - self._ui_cpu_s)
            self._ui_cpu_s = ui_cpu_s
            self._spent_s += cost
            self.update_cost_s = 0.5 * self.update_cost_s + 0.5 * cost
            self._in_flight = False
