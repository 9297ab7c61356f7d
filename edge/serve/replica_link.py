"""edge-serve's app behind a gateway: an HTTP request carried to a replica that runs the app, its reply carried back,
and a replica lost mid-reply turned into an error the client can read. Nothing here needs Ray; edge/serve/ray_deploy.py
puts the two halves in Ray Serve deployments.

    client ──HTTP──> ReplicaGateway ──ForwardedRequest──> replica: served(app, request) ──ASGI messages──┐
             ◄────────────────── the messages, sent on as they come ◄─────────────────────────────────────┘

The replica runs edge-serve's own FastAPI app (edge/serve/app.py) on each request, so the routes, limits, errors and
metrics are the server's. When the messages stop with an error instead (the replica's process died, or it was
refused), the gateway ends the reply itself: an OpenAI-style error body when nothing was sent yet, else, in a
stream, an error event and [DONE], as edge-serve ends a stream that failed after its headers (edge/serve/relay.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from edge.serve.errors import ApiError
from edge.serve.responses import server_sent_event

log = logging.getLogger(__name__)

Message = dict[str, Any]  # one ASGI message


@dataclass(frozen=True)
class ForwardedRequest:
    """An HTTP request as the gateway read it: what a replica needs to replay it to the app (ASGI's HTTP scope, and
    the body, read whole)."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    scheme: str = "http"
    client: tuple[str, int] | None = None
    server: tuple[str, int] | None = None
    http_version: str = "1.1"

    @classmethod
    async def read(cls, scope: dict, receive: Callable, limit: int) -> "ForwardedRequest":
        """The request in `scope`, its body read up to one byte past `limit` (the app answers 413 to that)."""
        chunks, size, more = [], 0, True
        while more and size <= limit:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        client, server = scope.get("client"), scope.get("server")
        return cls(method=scope["method"], path=scope["path"], query_string=scope.get("query_string", b""),
                   headers=tuple((bytes(name), bytes(value)) for name, value in scope["headers"]),
                   body=b"".join(chunks), scheme=scope.get("scheme", "http"),
                   client=tuple(client) if client else None, server=tuple(server) if server else None,
                   http_version=scope.get("http_version", "1.1"))

    def scope(self) -> dict:
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": self.http_version,
                "method": self.method, "scheme": self.scheme, "path": self.path,
                "raw_path": self.path.encode(), "query_string": self.query_string, "root_path": "",
                "headers": [list(header) for header in self.headers], "client": self.client, "server": self.server}


async def served(app: Callable, request: ForwardedRequest) -> AsyncIterator[Message]:
    """Run the ASGI `app` on `request` and yield what it sends, as it sends it. Stopping early (the client went
    away, the gateway cancelled) tells the app its client disconnected and cancels it: its job stops at the next
    step."""
    messages: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    body: list[bytes] = [request.body]

    async def receive() -> Message:
        if body:
            return {"type": "http.request", "body": body.pop(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        messages.put_nowait(message)

    task = asyncio.ensure_future(app(request.scope(), receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    complete = False
    try:
        while (message := await messages.get()) is not None:
            complete = message["type"] == "http.response.body" and not message.get("more_body", False)
            yield message
            if complete:
                return
        if not complete:  # the app ended without finishing its reply: its error, else say so
            task.result()
            raise RuntimeError("edge-serve's app ended without finishing its reply")
    finally:
        gone.set()
        if not task.done():
            task.cancel()


Forward = Callable[[ForwardedRequest], AsyncGenerator[Message, None]]


class ReplicaGateway:
    """The ASGI app in front of the replicas: each HTTP request read, forwarded with `forward` (which yields the
    replica's ASGI messages) and its reply sent on. When the messages end in an error, `describe` names it as an
    ApiError (a lost replica: 503 with Retry-After) and the client gets that error rather than a cut-off reply."""

    def __init__(self, forward: Forward, describe: Callable[[BaseException], ApiError], max_body_bytes: int) -> None:
        self.forward, self.describe, self.max_body_bytes = forward, describe, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":  # websockets: the OpenAI API has none
            await send({"type": "websocket.close", "code": 1003})
            return
        request = await ForwardedRequest.read(scope, receive, self.max_body_bytes)
        reply, replies = ReplyInFlight(), self.forward(request)
        try:
            async for message in replies:
                reply.note(message)
                await send(message)
        except Exception as error:  # noqa: BLE001 - whatever ended the replica's reply, the client hears of it
            failure = self.describe(error)
            log.warning("%s %s: %s", request.method, request.path, failure.message)
            for message in reply.ending(failure):
                await send(message)
        finally:  # the client went away (a cancellation): the replica stops generating
            await replies.aclose()


class ReplyInFlight:
    """What of a reply has gone out: whether its headers were sent, whether it is a stream of server-sent events,
    whether it is complete."""

    def __init__(self) -> None:
        self.started = self.event_stream = self.complete = False

    def note(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            content_type = dict(message.get("headers", ())).get(b"content-type", b"")
            self.event_stream = content_type.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True

    def ending(self, failure: ApiError) -> list[Message]:
        """The messages that end this reply with `failure`: the whole error response before the headers; after
        them, in a stream, the error as its last event before [DONE]; otherwise nothing (the connection closes)."""
        if not self.started:
            body = json.dumps(failure.body()).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       *((name.lower().encode(), value.encode()) for name, value in failure.headers.items())]
            return [{"type": "http.response.start", "status": failure.status, "headers": headers},
                    {"type": "http.response.body", "body": body, "more_body": False}]
        if self.event_stream and not self.complete:
            events = server_sent_event(failure.body()) + server_sent_event("[DONE]")
            return [{"type": "http.response.body", "body": events.encode(), "more_body": False}]
        return []


async def lifespan(receive: Callable, send: Callable) -> None:
    """ASGI's lifespan protocol, for a server that runs it: nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
