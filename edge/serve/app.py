"""The FastAPI app: OpenAI's chat and text completions, the model list and a health check, on one loaded model.

    POST /v1/chat/completions   POST /v1/completions     streaming (server-sent events) or whole
    GET  /v1/models             GET  /health             503 while the model loads
    GET  /metrics               Prometheus' text format (edge/serve/metrics.py); needs the API key when one is set

Before any route, edge/serve/access.py checks the Host (an allow-list), the Origin (only --cors origins) and answers
the --cors origins' preflights. Each route is in edge/serve/routes/ (a router a module) and reads the server's state (the
configuration and the generation queue, edge/serve/state.py) through a dependency; every route but /health depends on
`require_api_key`. A completion route reads the body (JSON only) and checks it in a worker thread, within the
prompt limits (edge/serve/request_body.py), so a prompt that does not fit never takes a generation slot; it then queues
one job (429 with Retry-After when the queue is full) and relays the job's events as SSE chunks or one body
(edge/serve/relay.py). A client that goes away cancels its job. edge/serve/error_handlers.py turns whatever a handler raised
into an OpenAI-style error.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from edge.serve.access import AccessGuard
from edge.serve.error_handlers import add_error_handlers
from edge.serve.generation_queue import GenerationQueue
from edge.serve.metrics import RequestCounter
from edge.serve.routes import ROUTERS
from edge.serve.state import ServeConfig, ServerState

__all__ = ["COUNTED_ROUTES", "ServeConfig", "create_app"]

COUNTED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/health"})


def create_app(config: ServeConfig, generations: GenerationQueue) -> FastAPI:
    """The app serving `generations`' engine under `config`: the access guard and the request counter around the
    routers, and the error handlers."""
    app = FastAPI(title="edge-serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = ServerState(config, generations)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(AccessGuard, listen_host=config.listen_host, allowed_hosts=config.allowed_hosts,
                       cors_origins=config.cors_origins)
    generations.metrics.routes = COUNTED_ROUTES
    app.add_middleware(RequestCounter, metrics=generations.metrics)  # added last: runs first, so refusals count too
    for router in ROUTERS:
        app.include_router(router)
    add_error_handlers(app)
    return app
