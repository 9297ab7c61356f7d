"""edge-serve's routes, one router a module: `chat` (POST /v1/chat/completions), `completions` (POST
/v1/completions), `info` (GET /health, /metrics, /v1/models). Every route but /health depends on `require_api_key`
(edge/serve/state.py)."""

from __future__ import annotations

from edge.serve.routes import chat, completions, info

ROUTERS = (chat.router, completions.router, info.router)
