"""GET /health (503 while the model loads; no API key), /metrics (Prometheus' text format, edge/serve/metrics.py) and
/v1/models (the one model this server runs)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from edge.serve.errors import ApiError
from edge.serve.state import ServeConfig, State, require_api_key

router = APIRouter()


@router.get("/health")
async def health(state: State) -> JSONResponse:
    generations = state.generations
    if not generations.loaded.is_set():
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "1"})
    if generations.engine is None:
        return JSONResponse({"status": "error", "error": str(generations.load_error)}, status_code=503)
    return JSONResponse({"status": "ok", "model": state.config.model_id,
                         "queue": {"waiting": generations.waiting, "limit": generations.limit},
                         "replies": generations.replies()})


@router.get("/metrics", dependencies=[Depends(require_api_key)])
async def prometheus_metrics(request: Request, state: State) -> Response:
    page, content_type = state.metrics.exposition(request.headers.get("accept", ""))
    return Response(page, media_type=content_type)


@router.get("/v1/models", dependencies=[Depends(require_api_key)])
async def models(state: State) -> dict:
    return {"object": "list", "data": [model_card(state.config)]}


@router.get("/v1/models/{model_id:path}", dependencies=[Depends(require_api_key)])
async def model(model_id: str, state: State) -> dict:
    config = state.config
    if model_id != config.model_id:
        raise ApiError(404, f"The model {model_id!r} does not exist; this server runs {config.model_id!r}",
                       kind="not_found_error", param="model", code="model_not_found")
    return model_card(config)


def model_card(config: ServeConfig) -> dict:
    return {"id": config.model_id, "object": "model", "created": 0, "owned_by": "edge"}
