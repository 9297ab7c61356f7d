"""One worker thread loads the engine, then runs every generation in arrival order from a bounded queue.

    HTTP handlers (asyncio) ──submit(job)──> queue.Queue(maxsize) ──> worker thread: engine.chat / engine.generate
            ▲                                   (full: QueueFull -> 429)        │ one Event per step
            └──────────── EventChannel (loop.call_soon_threadsafe) ◄────────────┘

An engine runs one generation at a time, so one worker is all the engine can use; serving in arrival order also
keeps a conversation's turns in order, and the engine reuses the KV cache of the longest prefix it already holds
(the earlier turns). A job whose client went away is skipped if it has not started, and stops at the next step
(`should_stop`) if it has.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

from edge.engine import Engine
from edge.errors import EdgeError
from edge.events import Event
from edge.serve.metrics import ServerMetrics

log = logging.getLogger(__name__)

# a job's work: given the engine and the job's should_stop, the events of one generation
Generation = Callable[[Engine, Callable[[], bool]], Iterator[Event]]


class QueueFull(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the queue is full; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class EventChannel:
    """Carries one job's events (or the exception that ended it) from the worker thread to the asyncio side."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: asyncio.Queue[Event | BaseException] = asyncio.Queue()

    def put(self, item: Event | BaseException) -> None:  # worker thread
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    async def get(self) -> Event | BaseException:  # event loop
        return await self._items.get()


@dataclass
class Job:
    generation: Generation
    channel: EventChannel
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class GenerationQueue:
    """`start(load)` loads in the worker thread (`loaded` is set when it ends, `engine` or `load_error` says how);
    `submit(job)` queues a job or raises QueueFull."""

    def __init__(self, limit: int) -> None:
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=limit)
        self.limit = limit
        self.engine: Engine | None = None
        self.load_error: BaseException | None = None
        self.loaded = threading.Event()
        self._finished: Counter[str] = Counter()  # jobs by finish reason ("skipped": cancelled before starting)
        self._finished_lock = threading.Lock()
        self._mean_job_s = 1.0  # running mean of a job's duration, for Retry-After
        self._thread: threading.Thread | None = None
        self._running: Job | None = None
        self._running_since = 0.0  # when the running job started (time.perf_counter)
        self.closing = threading.Event()  # set by close(): the server is stopping
        self.metrics = ServerMetrics(self)  # GET /metrics: requests (counted by the app), replies' tokens (here)

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    @property
    def generating(self) -> bool:
        return self._running is not None

    def replies(self) -> dict[str, int]:
        """Jobs so far by how they ended: edge's finish reasons, "skipped" (the client left before it started),
        "refused" (an EdgeError: a 400) and "failed" (anything else: a 500)."""
        with self._finished_lock:
            return dict(self._finished)

    def _count(self, outcome: str) -> None:
        with self._finished_lock:
            self._finished[outcome] += 1

    def start(self, load: Callable[[], Engine], on_load_error: Callable[[BaseException], None] | None = None) -> None:
        self._thread = threading.Thread(target=self._run, args=(load, on_load_error), name="edge-serve-generation",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull(self.retry_after_s()) from None

    def retry_after_s(self) -> int:
        """Seconds until a full queue likely has room: a place frees when the running job ends, so the mean job's
        length less what the running one has run (at least 1 s); not the whole queue's, which overestimates."""
        elapsed = time.perf_counter() - self._running_since if self._running is not None else 0.0
        return max(1, math.ceil(self._mean_job_s - elapsed))

    def close(self) -> None:
        """The server is stopping (SIGINT, SIGTERM): from now on handlers refuse new requests and end open replies
        with an error; the running job stops at its next step, the waiting ones are skipped."""
        self.closing.set()
        running = self._running
        if running is not None:
            running.cancel()
        for job in list(self._jobs.queue):
            if job is not None:
                job.cancel()

    def stop(self) -> None:
        """Finish the running job, drop the waiting ones, and end the worker."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
        self._jobs.put(None)
        if self._thread is not None and self.loaded.is_set():  # a load under way is not waited for (daemon thread)
            self._thread.join(timeout=30)

    def _run(self, load: Callable[[], Engine], on_load_error: Callable[[BaseException], None] | None) -> None:
        try:
            self.engine = load()
        except BaseException as error:  # noqa: BLE001 - reported through /health and the command line
            self.load_error = error
            if on_load_error is not None:
                on_load_error(error)
            return
        finally:
            self.loaded.set()
        while (job := self._jobs.get()) is not None:
            self._serve(job)

    def _serve(self, job: Job) -> None:
        if job.cancelled.is_set():
            self._count("skipped")
            return
        started = self._running_since = time.perf_counter()
        self._running = job
        try:
            for event in job.generation(self.engine, job.cancelled.is_set):
                job.channel.put(event)
                if event.finished:
                    self._count(event.finish_reason)
                    self.metrics.count_reply(event.stats)
        except EdgeError as error:  # about the request: the client gets a 400
            self._count("refused")
            job.channel.put(error)
        except Exception as error:  # noqa: BLE001 - the worker must outlive any one request
            log.exception("generation failed")
            self._count("failed")
            job.channel.put(error)
        finally:
            self._running = None
        self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.perf_counter() - started)
