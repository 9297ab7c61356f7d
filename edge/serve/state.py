"""What every route reads: the server's configuration and its generation queue, as one `ServerState` on `app.state`,
handed to handlers by the `server_state` dependency; and `require_api_key`, the dependency that guards every route
but /health.

    @router.get("/v1/models", dependencies=[Depends(require_api_key)])
    async def models(state: State) -> dict: ...
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from edge.engine import Engine, GenerationOptions
from edge.serve.errors import ApiError
from edge.serve.generation_queue import GenerationQueue
from edge.serve.metrics import ServerMetrics


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


@dataclass(frozen=True)
class ServerState:
    """The options and limits (`config`), and the generation queue: the engine once loaded, the jobs waiting, the
    replies and metrics counted."""

    config: ServeConfig
    generations: GenerationQueue

    @property
    def metrics(self) -> ServerMetrics:
        return self.generations.metrics

    def loaded_engine(self) -> Engine:
        """The engine; a 503 while it loads or if it failed to."""
        generations = self.generations
        if not generations.loaded.is_set():
            raise ApiError(503, "the model is still loading; retry shortly (GET /health answers 200 once it is "
                           "ready)", kind="unavailable_error", code="model_loading", headers={"Retry-After": "1"})
        if generations.engine is None:
            raise ApiError(503, f"the model failed to load: {generations.load_error}", kind="unavailable_error",
                           code="model_load_failed")
        return generations.engine


async def server_state(request: Request) -> ServerState:
    return request.app.state.server


State = Annotated[ServerState, Depends(server_state)]  # a handler's parameter: the server's state


async def require_api_key(request: Request, state: State) -> None:
    """With an API key set, the request must carry "Authorization: Bearer KEY" (a 401 otherwise)."""
    key = state.config.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())):
        raise ApiError(401, "Incorrect API key provided: send the key edge-serve was started with "
                       "(--api-key or EDGE_API_KEY) as 'Authorization: Bearer KEY'",
                       kind="authentication_error", code="invalid_api_key")
