"""A request's body, read and checked before anything is queued: JSON sent as application/json only (415), at most
--max-body-bytes (413), parsed and validated against its schema, and the prompt within the limits.

Parsing, rendering the chat template and counting the prompt's tokens run in a worker thread (starlette's
threadpool), never on the event loop: `parsed_body` reads the bytes on the loop and hands them to a route's check.
The prompt limits come in two steps: its characters (before anything is tokenized: more than CHARS_PER_TOKEN per
token of the context never fits, --max-prompt-chars overrides that) and then its tokens (the context), so a prompt
that does not fit never takes the generation slot.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from fastapi import Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from edge.engine import Engine, GenerationOptions
from edge.errors import EdgeError
from edge.memory.device import return_freed_heap
from edge.serve.errors import ApiError, api_error, from_validation
from edge.serve.schemas import SamplingRequest
from edge.serve.state import ServeConfig, ServerState

LARGE_BODY_BYTES = 2**20  # after a body this large, freed heap pages are handed back (edge.memory.device)
CHARS_PER_TOKEN = 16  # the default prompt limit in characters, per token of the context: more never fits it
VERBS = {"messages": "are", "prompt": "is"}


async def parsed_body(request: Request, state: ServerState, check: Callable[[bytes], Any]) -> Any:
    """The request's body read, then parsed and checked off the event loop; after a large one (a refused 10 MB
    message) the C heap's freed pages go back to the OS, else the worker threads' heaps keep them."""
    raw = await read_body(request, state.config.max_body_bytes)
    try:
        return await run_in_threadpool(check, raw)
    finally:
        if len(raw) > LARGE_BODY_BYTES:
            del raw
            await run_in_threadpool(return_freed_heap)


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


def parsed(kind: type[SamplingRequest], raw: bytes) -> Any:
    """The body as a `kind` request: a JSON object that passes its schema; anything else is a 400."""
    try:
        return kind.model_validate(json_object(raw))
    except ValidationError as error:
        raise from_validation(error) from None


def json_object(raw: bytes) -> dict:
    """The body as a JSON object; anything else is a 400."""
    try:
        data = json.loads(raw, parse_constant=refuse_constant)
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects deeper than any request needs (Python's JSON "
                       "reader stops at about 1,000 levels); send a flatter JSON object", code="invalid_json") from None
    except ValueError as error:
        raise ApiError(400, f"the request body is not valid JSON ({error}); send a JSON object",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


def refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def utf8(text: str, what: str, param: str) -> str:
    """`text` if it is valid Unicode (JSON may carry a lone surrogate, which no tokenizer takes); else a 400."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(400, f"{what} is not valid UTF-8 text (a lone surrogate at character {error.start}); send "
                       "valid Unicode", param=param) from None
    return text


def prompt_limits(config: ServeConfig, engine: Engine, param: str, chars: int,
                  count_tokens: Callable[[], int]) -> None:
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
        raise ApiError(400, f"the {param} {verb} {tokens:,} tokens but the context holds {engine.max_context:,}; "
                       "shorten it, or start edge-serve with a longer context (--max-context N)", param=param,
                       code="context_length_exceeded")


def engine_options(body: SamplingRequest, config: ServeConfig) -> GenerationOptions:
    """The request's options over the server's defaults; plain decoding when sampling, unless the drafter was asked
    for (--drafter)."""
    options = body.generation_options(config.defaults)
    if options.temperature > 0 and not config.speculate_when_sampling:
        options = dataclasses.replace(options, speculate=False)
    return options
