"""A checked request's one job, queued, and its events relayed to the client: as SSE chunks, or gathered into one
body.

`respond` queues the job (429 with Retry-After when the queue is full, 503 once the server is stopping) and waits
for its first event, so that a request refused by the engine still gets its 4xx status. A client that goes away
cancels its job: a waiting job is skipped, a running one stops after its current step. A stream whose client stops
reading for --write-timeout is cut off (`ReadStream`). In a stream, tool calls are held back until complete and
sent as one `delta.tool_calls` chunk (edge/decoding/tools.py); an error after the headers went out is the last
event before [DONE].
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, AsyncIterator

from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from edge.decoding.tools import ToolCallStream
from edge.events import Event
from edge.serve.errors import ApiError, api_error
from edge.serve.jobs import BatchPrompt, EventChannel, Generation, Job, QueueFull
from edge.serve.responses import Reply, server_sent_event
from edge.serve.schemas import SamplingRequest
from edge.serve.state import ServerState

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25  # how often a handler waiting for a whole reply checks that its client is still there


class ClientGone(Exception):
    """The client closed the connection while its reply was being made."""


async def respond(request: Request, state: ServerState, reply: Reply, generation: Generation, body: SamplingRequest,
                  param: str, batch_prompt: BatchPrompt | None = None, max_tokens: int = 0) -> Response:
    """Queue `generation` as one job and answer with its events: streamed when the body asks for it, else whole.
    With `batch_prompt` the job may run in a slot of the batch instead (edge/serve/scheduler.py); `max_tokens`, its
    token budget, counts toward the Retry-After of a later refusal."""
    generations = state.generations
    job = Job(generation, EventChannel(asyncio.get_running_loop()), batch_prompt, max_tokens)
    submit(state, job)
    try:
        first = await next_event(job, request, param, generations.closing)
    except BaseException:
        job.cancel()  # refused, or the client went away while the job waited
        raise
    if body.stream:  # a disconnect cancels the stream, which cancels the job; so does the stream's end
        events = streamed(job, reply, first, body.include_usage, param, generations.closing)
        return ReadStream(events, job, state.config.write_timeout_s, media_type="text/event-stream",
                          background=BackgroundTask(job.cancel),
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        text, last = [first.text], first
        while not last.finished:
            last = await next_event(job, request, param, generations.closing)
            text.append(last.text)
    finally:
        job.cancel()  # the client went away, or the reply is done and there is nothing left to stop
    return JSONResponse(reply.whole("".join(text), last))


def submit(state: ServerState, job: Job) -> None:
    """Queue the job; a 503 once the server is stopping, a 429 with Retry-After when the queue is full."""
    generations = state.generations
    if generations.closing.is_set():
        raise shutting_down()
    try:
        generations.submit(job)
    except QueueFull as full:
        raise ApiError(429, f"{full}: edge-serve generates {generations.slots} "
                       f"repl{'y' if generations.slots == 1 else 'ies'} at a time and {generations.limit} requests are "
                       "already waiting", kind="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(full.retry_after_s)}) from None


async def streamed(job: Job, reply: Reply, first: Event, include_usage: bool, param: str,
                   closing: threading.Event) -> AsyncIterator[str]:
    """The reply's server-sent events, from `first` on: the deltas, the tool calls, the usage chunk, [DONE]."""
    calls = ToolCallStream(reply.tools) if reply.tools else None  # holds back what may be a tool call
    try:
        if reply.chat:
            yield server_sent_event(reply.chunk("", first=True))
        event = first
        while True:
            text = calls.push(event.text) if calls is not None else event.text
            if event.finished and calls is not None:
                rest, found = calls.finish()
                text += rest
                if found:
                    if text:
                        yield server_sent_event(reply.chunk(text))
                    yield server_sent_event(reply.tool_call_chunk(found))
                    yield server_sent_event(reply.chunk("", event, tool_calls=True))
                    break
            if text or event.finished:
                yield server_sent_event(reply.chunk(text, event if event.finished else None))
            if event.finished:
                break
            item = None
            while item is None:
                item = await next_item(job, closing)
            if isinstance(item, BaseException):  # after the headers went out: the error is the last event
                yield server_sent_event(api_error(item, param).body())
                break
            event = item
        if include_usage and event.finished:
            yield server_sent_event(reply.usage_chunk(event))
        yield server_sent_event("[DONE]")
    finally:
        job.cancel()  # a disconnect cancels this generator at its await: stop the generation at its next step


class ReadStream(StreamingResponse):
    """A stream its client must keep reading: a write that waits over `write_timeout_s` (the client stopped reading
    and the socket's buffers are full) ends the reply and cancels its job, so a slow reader never holds the one
    generation slot. The connection is then closed (uvicorn logs that the response was not completed)."""

    def __init__(self, content: AsyncIterator[str], job: Job, write_timeout_s: float, **options: Any) -> None:
        super().__init__(content, **options)
        self.job, self.write_timeout_s = job, write_timeout_s

    async def stream_response(self, send: Any) -> None:
        async def timed(message: dict) -> None:
            await asyncio.wait_for(send(message), self.write_timeout_s)

        try:
            await super().stream_response(timed)
        except asyncio.TimeoutError:
            self.job.cancel()
            await self.body_iterator.aclose()
            log.warning("a client read nothing of its stream for %g s: its reply was cut off (--write-timeout)",
                        self.write_timeout_s)


async def next_event(job: Job, request: Request, param: str, closing: threading.Event) -> Event:
    """The job's next event, watching the client and the server's shutdown meanwhile; the error that ended the job,
    as an ApiError."""
    while True:
        item = await next_item(job, closing)
        if item is None:
            if await request.is_disconnected():
                raise ClientGone() from None
            continue
        if isinstance(item, BaseException):
            raise api_error(item, param)
        return item


async def next_item(job: Job, closing: threading.Event) -> Event | BaseException | None:
    """The job's next event or error within DISCONNECT_POLL_S (else None); once the server is stopping (SIGINT,
    SIGTERM: `closing`), the 503 that ends the reply instead, not the cut-off rest of it."""
    try:
        item = await asyncio.wait_for(job.channel.get(), DISCONNECT_POLL_S)
    except asyncio.TimeoutError:
        item = None
    return shutting_down() if closing.is_set() else item


def shutting_down() -> ApiError:
    return ApiError(503, "edge-serve is shutting down, so this reply was cut off; retry once it is back",
                    kind="unavailable_error", code="server_shutting_down")
