"""A request's job as the generation thread takes it, and where it waits: `Job` (its generation, its batch prompt,
its channel back to the handler), `EventChannel`, `WaitingJobs` (the bounded queue, in arrival order) and
`Throughput` (what Retry-After is estimated from)."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from edge.engine import Engine, GenerationOptions
from edge.events import Event

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


# a job's batch prompt: given the engine and the job's should_stop, its prompt's token ids and its options for the
# batch (edge/engine/batched.py), or None where the engine's own loop must run it (a grammar)
BatchPrompt = Callable[[Engine, Callable[[], bool]], "tuple[list[int], GenerationOptions] | None"]


@dataclass(eq=False)
class Job:
    generation: Generation
    channel: EventChannel
    batch_prompt: BatchPrompt | None = None  # None: the engine's own loop runs it
    max_tokens: int = 0  # the reply's token budget (for Retry-After)
    cancelled: threading.Event = field(default_factory=threading.Event)
    route: object = None  # the scheduler's choice, once made: the batch's (prompt ids, options) or the engine loop

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Throughput:
    """Tokens per second of the generation thread while busy (an exponential moving average over its turns), and
    the tokens a reply takes: what Retry-After is estimated from."""

    tokens: float = 0.0
    seconds: float = 0.0
    reply_tokens: float | None = None  # mean tokens of finished replies
    decay: float = 0.98

    def record(self, tokens: int, seconds: float) -> None:
        self.tokens = self.decay * self.tokens + tokens
        self.seconds = self.decay * self.seconds + seconds

    def count_reply(self, tokens: int) -> None:
        self.reply_tokens = tokens if self.reply_tokens is None else 0.8 * self.reply_tokens + 0.2 * tokens

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.tokens > 0 and self.seconds > 0 else None

    def retry_after_s(self, waiting: list[Job]) -> int:
        """Seconds until the waiting jobs should have been taken: their expected tokens (the budget each asked for,
        at most the mean reply's) over the measured tokens per second; a second per job before anything was
        measured."""
        rate = self.tokens_per_s
        if rate is None:
            return max(1, len(waiting))

        def expected(job: Job) -> float:
            known = [tokens for tokens in (job.max_tokens, self.reply_tokens) if tokens]
            return min(known) if known else rate  # a second's worth
        return max(1, math.ceil(sum(expected(job) for job in waiting) / rate))


class WaitingJobs:
    """The jobs waiting for a slot, in arrival order, at most `limit` of them. Thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._jobs: deque[Job] = deque()
        self._changed = threading.Condition()
        self.stopped = False  # no more jobs: the loop ends once the running ones have

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: Job) -> bool:
        """Queue `job`; False when `limit` jobs are waiting already."""
        with self._changed:
            if len(self._jobs) >= self.limit:
                return False
            self._jobs.append(job)
            self._changed.notify()
            return True

    def snapshot(self) -> list[Job]:
        with self._changed:
            return list(self._jobs)

    def remove(self, job: Job) -> bool:
        """Take `job` out; False if it is no longer waiting (the server stopping took it)."""
        with self._changed:
            if job not in self._jobs:
                return False
            self._jobs.remove(job)
            return True

    def take_all(self) -> list[Job]:
        with self._changed:
            jobs, self._jobs = list(self._jobs), deque()
            return jobs

    def wait(self) -> None:
        """Until a job arrives or the queue stops."""
        with self._changed:
            while not self._jobs and not self.stopped:
                self._changed.wait()

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()


