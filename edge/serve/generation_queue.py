"""One generation thread loads the engine, then runs every generation: `--parallel` slots decoded together and the
engine's own loop beside them (edge/serve/scheduler.py), fed from a bounded queue in arrival order.

    HTTP handlers (asyncio) ──submit(job)──> WaitingJobs(limit) ──> generation thread: the batch's slots, one fused
            ▲                              (full: QueueFull -> 429)    pass a step; the engine's loop for the rest
            │                                                                 │ one Event per step
            └──────────── EventChannel (loop.call_soon_threadsafe) ◄──────────┘

One thread runs every pass, so the model never runs two at once. With one slot (--parallel 1) every job takes the
engine's loop in arrival order, which also reuses the KV cache of the longest prefix the engine already holds (a
conversation's earlier turns). A job whose client went away is skipped if it has not started, leaves the batch at
once if it is in it, and stops at the next step (`should_stop`) in the engine's loop. A refused request's
Retry-After is the queued work (its jobs' expected tokens) over the measured throughput (`Throughput`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Callable

from edge.engine import Engine
from edge.engine.batched import BatchedReplies
from edge.events import Stats
from edge.serve.jobs import EventChannel, Generation, Job, QueueFull, Throughput, WaitingJobs
from edge.serve.metrics import ServerMetrics
from edge.serve.scheduler import Scheduler

__all__ = ["EventChannel", "Generation", "GenerationQueue", "Job", "QueueFull"]

log = logging.getLogger(__name__)

class GenerationQueue:
    """`start(load)` loads in the generation thread (`loaded` is set when it ends, `engine` or `load_error` says
    how); `submit(job)` queues a job or raises QueueFull. `slots` replies are decoded together where the model
    allows (--parallel), with a prompt cache of `prompt_cache` bytes (--prompt-cache)."""

    def __init__(self, limit: int, slots: int = 1, prompt_cache: int = 0) -> None:
        self.waiting_jobs = WaitingJobs(limit)
        self.limit = limit
        self.requested_slots = slots
        self.prompt_cache = prompt_cache
        self.engine: Engine | None = None
        self.load_error: BaseException | None = None
        self.loaded = threading.Event()
        self._finished: Counter[str] = Counter()  # jobs by finish reason ("skipped": cancelled before starting)
        self._finished_lock = threading.Lock()
        self.throughput = Throughput()
        self._thread: threading.Thread | None = None
        self.scheduler: Scheduler | None = None
        self.closing = threading.Event()  # set by close(): the server is stopping
        self.metrics = ServerMetrics(self)  # GET /metrics: requests (counted by the app), replies' tokens (here)

    @property
    def waiting(self) -> int:
        return len(self.waiting_jobs)

    @property
    def generating(self) -> bool:
        return self.busy_slots > 0

    @property
    def slots(self) -> int:
        """Replies decoded together: the batch's slots (1 until loaded, and where the model has no fused step)."""
        scheduler = self.scheduler
        return scheduler.batch.slots if scheduler is not None and scheduler.batch is not None else 1

    @property
    def busy_slots(self) -> int:
        scheduler = self.scheduler
        return scheduler.busy if scheduler is not None else 0

    @property
    def batch_size(self) -> int:
        """Sequences in the batch's last pass."""
        scheduler = self.scheduler
        return scheduler.batch.last_size if scheduler is not None and scheduler.batch is not None else 0

    @property
    def prompt_cache_bytes(self) -> int:
        """Bytes the batch's prompt cache holds now."""
        scheduler = self.scheduler
        return scheduler.batch.prompt_cache_bytes if scheduler is not None and scheduler.batch is not None else 0

    def replies(self) -> dict[str, int]:
        """Jobs so far by how they ended: edge's finish reasons, "skipped" (the client left before it started),
        "refused" (an EdgeError: a 400) and "failed" (anything else: a 500)."""
        with self._finished_lock:
            return dict(self._finished)

    def count(self, outcome: str) -> None:
        with self._finished_lock:
            self._finished[outcome] += 1

    def finished(self, job: Job, outcome: str, stats: Stats, slot: int | None) -> None:
        """A reply that ended (its last event sent, or its client gone): counted by outcome, slot and tokens."""
        self.count(outcome)
        self.metrics.count_reply(stats, slot)
        self.throughput.count_reply(stats.generated_tokens)

    def start(self, load: Callable[[], Engine], on_load_error: Callable[[BaseException], None] | None = None) -> None:
        self._thread = threading.Thread(target=self._run, args=(load, on_load_error), name="edge-serve-generation",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        if not self.waiting_jobs.put(job):
            raise QueueFull(self.throughput.retry_after_s(self.waiting_jobs.snapshot()))

    def close(self) -> None:
        """The server is stopping (SIGINT, SIGTERM): from now on handlers refuse new requests and end open replies
        with an error; the running jobs stop at once, the waiting ones are skipped."""
        self.closing.set()
        scheduler = self.scheduler
        running = list(scheduler.in_batch.values()) if scheduler is not None else []
        alone = scheduler.alone if scheduler is not None else None
        for job in running + ([alone[0]] if alone else []) + self.waiting_jobs.snapshot():
            job.cancel()

    def stop(self) -> None:
        """Finish the running jobs, drop the waiting ones, and end the generation thread."""
        for job in self.waiting_jobs.take_all():
            job.cancel()
            self.count("skipped")
        self.waiting_jobs.stop()
        if self._thread is not None and self.loaded.is_set():  # a load under way is not waited for (daemon thread)
            self._thread.join(timeout=30)

    def _run(self, load: Callable[[], Engine], on_load_error: Callable[[BaseException], None] | None) -> None:
        try:
            engine = load()
            batch = self.batch(engine)
            self.engine = engine  # handlers queue jobs from now on
        except BaseException as error:  # noqa: BLE001 - reported through /health and the command line
            self.load_error = error
            if on_load_error is not None:
                on_load_error(error)
            return
        finally:
            self.loaded.set()
        self.scheduler = Scheduler(self, self.engine, batch)
        self.scheduler.run()

    def batch(self, engine: Engine) -> BatchedReplies | None:
        """The slots decoded together (None with one slot, or where the model has no fused step: said in the log)."""
        if self.requested_slots <= 1:
            return None
        batch = BatchedReplies.for_engine(engine, self.requested_slots, self.prompt_cache)
        if batch is None:
            log.warning("--parallel %d: this model does not run on edge's fused CPU step (a GGUF file, packed int8 or "
                        "int4 weights, or a checkpoint on the CPU in float32 with a plain KV cache does), so replies "
                        "are generated one at a time", self.requested_slots)
        elif batch.slots < self.requested_slots:
            log.warning("--parallel %d: one fused pass of this model takes %d rows, so %d slots run",
                        self.requested_slots, batch.slots, batch.slots)
        return batch
