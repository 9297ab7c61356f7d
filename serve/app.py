"""The FastAPI app: OpenAI's chat and text completions, the model list and a health check, on one loaded model.

    POST /v1/chat/completions   POST /v1/completions     streaming (server-sent events) or whole
    GET  /v1/models             GET  /health             503 while the model loads
    GET  /metrics               Prometheus' text format (serve/metrics.py); needs the API key when one is set

Before any route, serve/access.py checks the Host (an allow-list), the Origin (only --cors origins) and answers
the --cors origins' preflights. A handler checks the API key and reads the body (JSON only); parsing it, rendering the chat template and counting the
prompt's tokens run in a worker thread (starlette's threadpool), never on the event loop, within the prompt limits
(characters, checked before anything is tokenized, then the context in tokens), so a prompt that does not fit never
takes the generation slot. It then queues one job (429 with Retry-After when the queue is full) and relays
the job's events: as SSE chunks, or gathered into one body. A client that goes away cancels its job: a waiting
job is skipped, a running one stops after its current step.

Chat completions take `response_format` (a JSON object, or JSON under a schema, by grammar) and `tools` with
`tool_choice`: a reply's tool calls come back as OpenAI's `message.tool_calls` (finish_reason "tool_calls"), in a
stream as one `delta.tool_calls` chunk once the call is complete; text that may open a call is held back until
it is known not to be one (edge/decoding/tools.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response, StreamingResponse

from edge.decoding.constrained import response_format_grammar
from edge.engine import Engine, GenerationOptions
from edge.errors import EdgeError
from edge.events import Event
from edge.decoding.tools import ToolCallStream, ToolPlan, plan_tool_use
from memory.device import return_freed_heap
from serve.access import AccessGuard
from serve.errors import ApiError, from_edge_error, from_validation
from serve.generation_queue import EventChannel, Generation, GenerationQueue, Job, QueueFull
from serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, RequestCounter
from serve.responses import Reply, server_sent_event
from serve.schemas import ChatCompletionRequest, CompletionRequest, SamplingRequest

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25  # how often a handler waiting for a whole reply checks that its client is still there
LARGE_BODY_BYTES = 2**20  # after a body this large, freed heap pages are handed back (memory.device)
CHARS_PER_TOKEN = 16  # the default prompt limit in characters, per token of the context: more never fits it
VERBS = {"messages": "are", "prompt": "is"}
ROUTES = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /metrics and GET /health"
COUNTED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/health"})


@dataclass(frozen=True)
class ServeConfig:
    model_id: str  # the name /v1/models lists and replies carry
    defaults: GenerationOptions = GenerationOptions()  # for the fields a request leaves out
    api_key: str | None = None  # when set, every route but /health needs "Authorization: Bearer KEY"
    speculate_when_sampling: bool = True  # False: requests with temperature > 0 decode plainly
    max_body_bytes: int = 16 * 2**20
    listen_host: str = "127.0.0.1"  # --host: a name requests may carry in Host, besides the loopback names
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host: more names for Host
    cors_origins: tuple[str, ...] = ()  # --cors: web pages (scheme://host[:port]) that may call the API
    max_prompt_chars: int | None = None  # --max-prompt-chars; None: CHARS_PER_TOKEN per token of the context
    write_timeout_s: float = 5.0  # --write-timeout: a stream whose client stops reading this long is cut off


class ClientGone(Exception):
    """The client closed the connection while its reply was being made."""


def create_app(config: ServeConfig, generations: GenerationQueue) -> FastAPI:
    app = FastAPI(title="edge-serve", docs_url=None, redoc_url=None, openapi_url=None)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(AccessGuard, listen_host=config.listen_host, allowed_hosts=config.allowed_hosts,
                       cors_origins=config.cors_origins)
    metrics = generations.metrics
    metrics.routes = COUNTED_ROUTES
    app.add_middleware(RequestCounter, metrics=metrics)  # added last: runs first, so refusals are counted too

    def require_key(request: Request) -> None:
        if config.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), config.api_key.encode())):
            raise ApiError(401, "Incorrect API key provided: send the key edge-serve was started with "
                           "(--api-key or EDGE_API_KEY) as 'Authorization: Bearer KEY'",
                           kind="authentication_error", code="invalid_api_key")

    def loaded_engine() -> Engine:
        if not generations.loaded.is_set():
            raise ApiError(503, "the model is still loading; retry shortly (GET /health answers 200 once it is "
                           "ready)", kind="unavailable_error", code="model_loading", headers={"Retry-After": "1"})
        if generations.engine is None:
            raise ApiError(503, f"the model failed to load: {generations.load_error}", kind="unavailable_error",
                           code="model_load_failed")
        return generations.engine

    @app.get("/health")
    async def health() -> JSONResponse:
        if not generations.loaded.is_set():
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "1"})
        if generations.engine is None:
            return JSONResponse({"status": "error", "error": str(generations.load_error)}, status_code=503)
        return JSONResponse({"status": "ok", "model": config.model_id,
                             "queue": {"waiting": generations.waiting, "limit": generations.limit},
                             "replies": generations.replies()})

    @app.get("/metrics", dependencies=[Depends(require_key)])
    async def prometheus_metrics() -> Response:
        text = metrics.render(generations.waiting, generations.limit, generations.generating, generations.replies())
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/models", dependencies=[Depends(require_key)])
    async def models() -> dict:
        return {"object": "list", "data": [model_card(config)]}

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(require_key)])
    async def model(model_id: str) -> dict:
        if model_id != config.model_id:
            raise ApiError(404, f"The model {model_id!r} does not exist; this server runs {config.model_id!r}",
                           kind="not_found_error", param="model", code="model_not_found")
        return model_card(config)

    def prompt_limits(engine: Engine, param: str, chars: int, count_tokens: Callable[[], int]) -> None:
        """In a worker thread: the prompt's characters (before any tokenizing) and then its tokens must fit."""
        limit, verb = config.max_prompt_chars or CHARS_PER_TOKEN * engine.max_context, VERBS[param]
        if chars > limit:
            raise ApiError(400, f"the {param} {verb} {chars:,} characters, over the {limit:,} this server reads; shorten "
                           f"it, or start edge-serve with --max-prompt-chars N", param=param,
                           code="string_above_max_length")
        try:
            tokens = count_tokens()
        except EdgeError as error:
            raise api_error(error, param) from None
        if tokens >= engine.max_context:
            raise ApiError(400, f"the {param} {verb} {tokens:,} tokens but the context holds "
                           f"{engine.max_context:,}; shorten it, or start edge-serve with a longer context (--max-context N)", param=param,
                           code="context_length_exceeded")

    def checked_chat(raw: bytes) -> tuple[ChatCompletionRequest, list[dict], ToolPlan]:
        body = parsed(ChatCompletionRequest, json_object(raw))
        engine = loaded_engine()
        if engine.tokenizer.chat_template is None:
            raise ApiError(400, "this model has no chat template: send a plain prompt to /v1/completions, or start "
                           "edge-serve with a chat template (--chat-template FILE)", param="messages",
                           code="no_chat_template")
        messages, tokenizer = body.template_messages(), engine.tokenizer
        try:
            response_format_grammar(body.response_format)  # a schema llguidance cannot compile is refused here
        except EdgeError as error:
            raise ApiError(400, str(error), param="response_format", code="invalid_response_format") from None
        try:
            plan = plan_tool_use(tokenizer, messages, body.tool_list(), body.tool_choice_value())
        except EdgeError as error:
            raise ApiError(400, str(error), param="tools") from None
        chars = sum(len(message["content"] or "") + (len(json.dumps(message["tool_calls"]))
                                                      if message.get("tool_calls") else 0)
                    for message in messages) + (len(json.dumps(body.tool_list())) if body.tool_list() else 0)
        prompt_limits(engine, "messages", chars,
                      lambda: len(tokenizer.encode(utf8(tokenizer.apply_chat_template(
                          plan.messages, add_generation_prompt=True, **plan.template_kwargs), "the chat", "messages"),
                          add_special_tokens=False)))
        return body, messages, plan

    def checked_completion(raw: bytes) -> CompletionRequest:
        body = parsed(CompletionRequest, json_object(raw))
        engine, prompt = loaded_engine(), body.prompt
        if isinstance(prompt, str):
            prompt_limits(engine, "prompt", len(prompt),
                          lambda: len(engine.tokenizer.encode(utf8(prompt, "the prompt", "prompt"))))
        else:  # token ids
            prompt_limits(engine, "prompt", 0, lambda: len(prompt))
        return body

    async def parsed_body(request: Request, check: Callable[[bytes], Any]) -> Any:
        """The request's body read, then parsed and checked off the event loop; after a large one (a refused 10 MB
        message) the C heap's freed pages go back to the OS, else the worker threads' heaps keep them."""
        raw = await read_body(request, config.max_body_bytes)
        try:
            return await run_in_threadpool(check, raw)
        finally:
            if len(raw) > LARGE_BODY_BYTES:
                del raw
                await run_in_threadpool(return_freed_heap)

    @app.post("/v1/chat/completions", dependencies=[Depends(require_key)])
    async def chat_completions(request: Request) -> Response:
        body, messages, plan = await parsed_body(request, checked_chat)
        options = engine_options(body, config)
        tools, tool_choice = body.tool_list(), body.tool_choice_value()

        def generation(engine: Engine, should_stop) -> Any:
            return engine.chat(messages, tools=tools, tool_choice=tool_choice,
                               **vars(dataclasses.replace(options, should_stop=should_stop)))

        reply = Reply(chat=True, model=config.model_id, tools=tuple(tools) if plan.parse else None)
        return await respond(request, reply, generation, body, "messages")

    @app.post("/v1/completions", dependencies=[Depends(require_key)])
    async def completions(request: Request) -> Response:
        body = await parsed_body(request, checked_completion)
        prompt, options = body.prompt, engine_options(body, config)

        def generation(engine: Engine, should_stop) -> Any:
            return engine.generate(prompt, **vars(dataclasses.replace(options, should_stop=should_stop)))

        return await respond(request, Reply(chat=False, model=config.model_id), generation, body, "prompt")

    async def respond(request: Request, reply: Reply, generation: Generation, body: SamplingRequest,
                      param: str) -> Response:
        job = Job(generation, EventChannel(asyncio.get_running_loop()))
        if generations.closing.is_set():
            raise shutting_down()
        try:
            generations.submit(job)
        except QueueFull as full:
            raise ApiError(429, f"{full}: edge-serve generates one reply at a time and {generations.limit} "
                           "requests are already waiting", kind="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(full.retry_after_s)}) from None
        try:
            first = await next_event(job, request, param, generations.closing)
        except BaseException:
            job.cancel()  # refused, or the client went away while the job waited
            raise
        if body.stream:  # a disconnect cancels the stream, which cancels the job; so does the stream's end
            return ReadStream(streamed(job, reply, first, body.include_usage, param), job, config.write_timeout_s,
                              media_type="text/event-stream", background=BackgroundTask(job.cancel),
                              headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            text, last = [first.text], first
            while not last.finished:
                last = await next_event(job, request, param, generations.closing)
                text.append(last.text)
        finally:
            job.cancel()  # the client went away, or the reply is done and there is nothing left to stop
        return JSONResponse(reply.whole("".join(text), last))

    async def streamed(job: Job, reply: Reply, first: Event, include_usage: bool, param: str) -> AsyncIterator[str]:
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
                    item = await next_item(job, generations.closing)
                if isinstance(item, BaseException):  # after the headers went out: the error is the last event
                    yield server_sent_event(api_error(item, param).body())
                    break
                event = item
            if include_usage and event.finished:
                yield server_sent_event(reply.usage_chunk(event))
            yield server_sent_event("[DONE]")
        finally:
            job.cancel()  # a disconnect cancels this generator at its await: stop the generation at its next step

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, error: ApiError) -> Response:
        return error.response()

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, error: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, error: HTTPException) -> Response:
        if error.status_code == 404:
            message = f"Unknown route {request.method} {request.url.path}; edge-serve serves {ROUTES}"
            return ApiError(404, message, kind="not_found_error", code="unknown_url").response()
        return ApiError(error.status_code, f"{error.detail} ({request.method} {request.url.path}); edge-serve "
                        f"serves {ROUTES}", code="method_not_allowed" if error.status_code == 405 else None).response()

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, error: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return ApiError(500, "internal error in edge-serve (see its log)", kind="server_error").response()

    return app


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


def model_card(config: ServeConfig) -> dict:
    return {"id": config.model_id, "object": "model", "created": 0, "owned_by": "edge"}


def engine_options(body: SamplingRequest, config: ServeConfig) -> GenerationOptions:
    options = body.generation_options(config.defaults)
    if options.temperature > 0 and not config.speculate_when_sampling:
        options = dataclasses.replace(options, speculate=False)
    return options


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes; not sent as application/json is a 415 (a web page's "simple" request, which skips the CORS
    preflight, cannot be), over `limit` bytes a 413."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, f"the request body must be JSON sent as 'Content-Type: application/json' (got "
                       f"{media_type or 'no Content-Type'!r}); set that header", code="unsupported_media_type")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def json_object(raw: bytes) -> dict:
    """The body as a JSON object; anything else is a 400."""
    try:
        data = json.loads(raw, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as error:
        raise ApiError(400, f"the request body is not valid JSON ({error}); send a JSON object",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


def utf8(text: str, what: str, param: str) -> str:
    """`text` if it is valid Unicode (JSON may carry a lone surrogate, which no tokenizer takes); else a 400."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(400, f"{what} is not valid UTF-8 text (a lone surrogate at character {error.start}); send "
                       "valid Unicode", param=param) from None
    return text


def refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def parsed(kind: type[SamplingRequest], data: dict) -> Any:
    try:
        return kind.model_validate(data)
    except ValidationError as error:
        raise from_validation(error) from None


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


def api_error(error: BaseException, param: str) -> ApiError:
    if isinstance(error, ApiError):
        return error
    if isinstance(error, EdgeError):
        return from_edge_error(error, param)
    return ApiError(500, "internal error in edge-serve (see its log)", kind="server_error")
