"""The generation thread's loop: the slots of a batch decoded together, and the engine's own loop beside them.

    waiting jobs (arrival order) ──admit──> batch: --parallel slots, one fused pass a step for all of them
                                      └───> the engine's loop: one job at a time (a grammar, a drafter, a model
                                            without the fused step, or --parallel 1), a step between batch steps

Every turn of the loop drops the cancelled jobs (a client that went away frees its slot at once), admits waiting
jobs into free slots in arrival order, then runs one batch step and one step of the engine's loop, sending each
job's events to its channel. A job joins the batch when its route can give its prompt as token ids
(`Job.batch_prompt`) and, if the engine would speculate on it, each slot can draft with its own copy of the
engine's drafter (ngram, retrieval: BatchedReplies.speculates), or it is greedy and not alone (it then decodes
plainly in the batch: the same reply); else it takes the engine's loop, one after another,
in arrival order. One thread runs both, so the model never runs two passes at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Iterator, Protocol

from edge.engine import Engine
from edge.engine.batched import BatchedReplies, BatchedReply
from edge.errors import EdgeError
from edge.events import Event, Stats
from edge.serve.jobs import Job, Throughput, WaitingJobs
from edge.serve.metrics import ServerMetrics

log = logging.getLogger(__name__)

ENGINE_LOOP = "engine loop"  # a job's route: the engine's own loop (else its prompt ids and options for the batch)


class Host(Protocol):
    """What the loop reads and reports to (the GenerationQueue)."""

    waiting_jobs: WaitingJobs
    throughput: Throughput
    metrics: ServerMetrics

    def count(self, outcome: str) -> None: ...

    def finished(self, job: Job, outcome: str, stats: Stats, slot: int | None) -> None: ...


class Scheduler:
    """The loop over `queue`'s waiting jobs, on `engine`, with `batch` (None: the engine's loop only)."""

    def __init__(self, queue: Host, engine: Engine, batch: BatchedReplies | None) -> None:
        self.queue, self.engine, self.batch = queue, engine, batch
        self.waiting = queue.waiting_jobs
        self.in_batch: dict[BatchedReply, Job] = {}
        self.alone: tuple[Job, Iterator[Event] | None] | None = None  # the engine loop's job, and its events

    @property
    def busy(self) -> int:
        """Replies being generated now."""
        return len(self.in_batch) + (self.alone is not None)

    def run(self) -> None:
        while True:
            self.drop_cancelled()
            if not self.waiting.stopped:
                self.admit()
            if not self.in_batch and self.alone is None:
                if self.waiting.stopped:
                    return
                self.waiting.wait()
                continue
            started, tokens = time.perf_counter(), 0
            if self.in_batch:
                tokens += self.step_batch()
            if self.alone is not None:
                tokens += self.step_alone()
            self.queue.throughput.record(tokens, time.perf_counter() - started)

    def admit(self) -> None:
        """Waiting jobs into free slots (and the engine's loop), in arrival order; cancelled ones are skipped."""
        for job in self.waiting.snapshot():
            if job.cancelled.is_set():
                if self.waiting.remove(job):
                    self.queue.count("skipped")
                continue
            if job.route is None:
                try:
                    job.route = self.route(job)
                except EdgeError as error:  # about the request: the client gets a 400
                    if self.waiting.remove(job):
                        self.queue.count("refused")
                        job.channel.put(error)
                    continue
            if job.route == ENGINE_LOOP:
                if self.alone is None and self.waiting.remove(job):
                    self.alone = (job, None)
            elif self.batch.free and self.waiting.remove(job):
                try:
                    self.in_batch[self.batch.start(*job.route)] = job
                except EdgeError as error:
                    self.queue.count("refused")
                    job.channel.put(error)

    def route(self, job: Job) -> tuple | str:
        """The batch's prompt ids and options for `job`, or ENGINE_LOOP: no batch, a route that cannot give them
        (a grammar), or a reply the engine would speculate on with a drafter the batch's slots cannot each have (a
        draft model: its cache is one sequence's) and that is sampled (the seed's reply is the speculative one) or
        alone (speculation is the faster then). A greedy one among others joins the batch plainly: its reply is the
        same, and its rows share the others' passes."""
        if self.batch is None or job.batch_prompt is None:
            return ENGINE_LOOP
        prepared = job.batch_prompt(self.engine, job.cancelled.is_set)
        if prepared is None:
            return ENGINE_LOOP
        prompt_ids, opts = prepared
        if self.engine.drafter is None or not opts.speculate or self.batch.speculates:
            return prepared
        if opts.greedy and self.others_than(job):  # the same reply plainly, in a pass shared with the others
            return prompt_ids, dataclasses.replace(opts, speculate=False)
        return ENGINE_LOOP

    def others_than(self, job: Job) -> bool:
        """Whether a reply is being generated, or another job waits, beside `job`."""
        return bool(self.in_batch) or self.alone is not None or any(other is not job for other in
                                                                    self.waiting.snapshot())

    def drop_cancelled(self) -> None:
        """Replies whose client went away (or the server is stopping) leave the batch now: their slots are free."""
        for reply, job in list(self.in_batch.items()):
            if job.cancelled.is_set():
                self.batch.remove(reply)
                del self.in_batch[reply]
                self.queue.finished(job, "stopped", reply.stats, reply.slot)

    def step_batch(self) -> int:
        """One fused pass over the batch's replies, their events sent; the tokens it chose."""
        try:
            events = self.batch.step()
        except Exception as error:  # noqa: BLE001 - the thread must outlive any one step: its replies end with it
            log.exception("a batch step failed")
            for reply, job in list(self.in_batch.items()):
                self.batch.remove(reply)
                self.queue.count("failed")
                job.channel.put(error)
            self.in_batch.clear()
            return 0
        self.queue.metrics.count_pass(self.batch.last_size)
        for reply, event in events:
            job = self.in_batch[reply]
            job.channel.put(event)
            if event.finished:
                del self.in_batch[reply]
                self.queue.finished(job, event.finish_reason, event.stats, reply.slot)
        return sum(len(event.token_ids) for _, event in events)

    def step_alone(self) -> int:
        """One step of the engine's own loop for its job; the tokens it added."""
        job, events = self.alone
        try:
            if events is None:
                events = job.generation(self.engine, job.cancelled.is_set)
                self.alone = (job, events)
            event = next(events)
        except Exception as error:  # noqa: BLE001 - the thread must outlive any one request
            outcome = "refused" if isinstance(error, EdgeError) else "failed"  # a 400, or a 500
            if outcome == "failed":
                log.exception("generation failed")
            self.queue.count(outcome)
            job.channel.put(error)
            self.end_alone(events)
            return 0
        job.channel.put(event)
        if event.finished:
            self.queue.finished(job, event.finish_reason, event.stats, None)
            self.end_alone(events)
        return len(event.token_ids)

    def end_alone(self, events: Iterator[Event] | None) -> None:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # the engine's generator releases the engine
        self.alone = None
