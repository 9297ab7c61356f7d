"""The generation thread's choices, without a server: which jobs the batch takes and which the engine's own loop
runs, the waiting queue's bound, and Retry-After from the measured throughput."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from edge.engine import GenerationOptions
from edge.serve.jobs import Job, Throughput, WaitingJobs
from edge.serve.scheduler import ENGINE_LOOP, Scheduler


def job(batch_prompt=None, max_tokens: int = 0) -> Job:
    return Job(generation=lambda engine, should_stop: iter(()), channel=SimpleNamespace(put=lambda item: None),
               batch_prompt=batch_prompt, max_tokens=max_tokens)


def scheduler(drafter=None, batch=True, speculates=False) -> Scheduler:
    host = SimpleNamespace(waiting_jobs=WaitingJobs(4))
    return Scheduler(host, SimpleNamespace(drafter=drafter), SimpleNamespace(speculates=speculates) if batch else None)


def test_the_batch_takes_a_prompt_and_the_engines_loop_the_rest():
    greedy = GenerationOptions(temperature=0.0)
    plain = job(lambda engine, should_stop: ([1, 2, 3], greedy))
    assert scheduler().route(plain) == ([1, 2, 3], greedy)
    assert scheduler(batch=False).route(plain) == ENGINE_LOOP  # --parallel 1, or a model without the fused step
    assert scheduler().route(job()) == ENGINE_LOOP  # a route that gives no prompt ids
    assert scheduler().route(job(lambda engine, should_stop: None)) == ENGINE_LOOP  # a grammar
    assert scheduler(drafter=object()).route(plain) == ENGINE_LOOP  # a draft model would speculate on it
    assert scheduler(drafter=object(), speculates=True).route(plain) != ENGINE_LOOP  # each slot drafts (ngram)
    busy = scheduler(drafter=object())
    busy.waiting.put(job())  # another request waits: a greedy reply is the same plainly, in the shared pass
    assert busy.route(plain) == ([1, 2, 3], dataclasses.replace(greedy, speculate=False))
    seeded = job(lambda engine, should_stop: ([1], GenerationOptions(temperature=0.7, seed=3)))
    assert busy.route(seeded) == ENGINE_LOOP  # its seed's reply is the speculative one
    unspeculated = job(lambda engine, should_stop: ([1], GenerationOptions(temperature=0.7, speculate=False)))
    assert scheduler(drafter=object()).route(unspeculated) != ENGINE_LOOP


def test_the_waiting_queue_holds_its_limit_in_arrival_order():
    waiting = WaitingJobs(2)
    first, second, third = job(), job(), job()
    assert waiting.put(first) and waiting.put(second) and not waiting.put(third)
    assert waiting.snapshot() == [first, second]
    assert waiting.remove(first) and not waiting.remove(first)  # taken once only
    assert waiting.put(third) and waiting.take_all() == [second, third] and len(waiting) == 0


def test_retry_after_is_the_queued_work_over_the_measured_throughput():
    throughput = Throughput()
    waiting = [job(max_tokens=64) for _ in range(3)]
    assert throughput.retry_after_s(waiting) == 3  # nothing measured yet: a second a job
    throughput.record(100, 1.0)
    assert throughput.tokens_per_s == 100
    assert throughput.retry_after_s(waiting) == 2  # 192 tokens at 100 tokens/s
    throughput.count_reply(20)  # replies end sooner than their budget: 60 tokens
    assert throughput.retry_after_s(waiting) == 1
    throughput.record(0, 9.0)  # slower now: 100 tokens over ~10 s
    assert throughput.retry_after_s([job(max_tokens=64) for _ in range(16)]) == 33
