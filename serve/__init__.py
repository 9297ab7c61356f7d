"""edge-serve: an OpenAI-compatible HTTP server on localhost, so any desktop app can use edge.

    edge-serve [MODEL_OR_BUNDLE]         the default model when MODEL is omitted; http://127.0.0.1:8080/v1

`cli.py` turns the flags into a load spec and the request defaults; `app.py` is the FastAPI app (routes, API key,
errors); `schemas.py` the request bodies, checked; `responses.py` the reply bodies and stream chunks built from
the engine's events; `generation_queue.py` the one worker thread that runs every generation in arrival order;
`errors.py` the OpenAI-style error bodies; `background.py` uvicorn in a thread (tests, the load test).
"""
