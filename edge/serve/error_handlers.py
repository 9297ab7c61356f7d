"""How the app answers what a handler raised: an ApiError as its OpenAI-style body, an unknown route or method as
one naming the routes served, a client that left with nothing (nobody reads it), anything else as a 500 that
points to the log (never a traceback)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from edge.serve.errors import ApiError
from edge.serve.relay import ClientGone

log = logging.getLogger(__name__)

ROUTES = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /metrics and GET /health"


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(ClientGone, on_client_gone)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


async def on_api_error(request: Request, error: ApiError) -> Response:
    return error.response()


async def on_client_gone(request: Request, error: ClientGone) -> Response:
    return Response(status_code=499)  # nobody reads it


async def on_http_error(request: Request, error: HTTPException) -> Response:
    if error.status_code == 404:
        message = f"Unknown route {request.method} {request.url.path}; edge-serve serves {ROUTES}"
        return ApiError(404, message, kind="not_found_error", code="unknown_url").response()
    return ApiError(error.status_code, f"{error.detail} ({request.method} {request.url.path}); edge-serve "
                    f"serves {ROUTES}", code="method_not_allowed" if error.status_code == 405 else None).response()


async def on_unexpected(request: Request, error: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return ApiError(500, "internal error in edge-serve (see its log)", kind="server_error").response()
