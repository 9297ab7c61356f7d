"""edge-serve: an OpenAI-compatible HTTP server on localhost, so any desktop app can use edge.

    edge-serve [MODEL_OR_BUNDLE]         the default model when MODEL is omitted; http://127.0.0.1:8080/v1

`cli.py` turns the flags into a load spec and the request defaults; `app.py` builds the FastAPI app (middleware,
routers, error handlers); `routes/` the routes, a router a module (chat, completions, info); `state.py` the
configuration and shared state the routes read through dependencies, and the API-key check; `request_body.py` the
body read, parsed and checked against the prompt limits; `relay.py` a request's job queued and its events relayed
(streamed or whole); `schemas.py` the request bodies, checked; `responses.py` the reply bodies and stream chunks
built from the engine's events; `generation_queue.py` the one generation thread that runs every generation, with
`scheduler.py` its loop (the slots decoded together, and the engine's own loop beside them) and `jobs.py` a
request's job and the queue it waits in; `errors.py` the OpenAI-style error bodies and `error_handlers.py` the
app's handlers that send them; `background.py` uvicorn in a thread (tests, the load test).
"""
