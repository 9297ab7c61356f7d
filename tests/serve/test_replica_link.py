"""edge-serve's app behind the gateway that Ray Serve runs (edge/serve/replica_link.py), without Ray: a request
carried to the app and its reply carried back unchanged, a replica lost before or during a reply ended with an
OpenAI-style error, a client that leaves stopping the generation; and the --ray flags checked before anything loads."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time

import httpx
import pytest

from edge import Engine
from edge.serve.app import ServeConfig, create_app
from edge.serve.cli import main
from edge.serve.errors import ApiError
from edge.serve.generation_queue import GenerationQueue
from edge.serve.replica_link import ForwardedRequest, ReplicaGateway, served
from edge.sources.builtin import builtin_model_path

MAX_BODY_BYTES = 4096
LOST = ApiError(503, "the replica stopped", kind="unavailable_error", code="replica_lost",
                headers={"Retry-After": "1"})


class ReplicaDied(Exception):
    pass


@pytest.fixture(scope="module")
def generations():
    queue = GenerationQueue(4)
    queue.start(lambda: Engine.load(builtin_model_path()))
    assert queue.loaded.wait(60) and queue.engine is not None
    yield queue
    queue.close()
    queue.stop()


@pytest.fixture(scope="module")
def app(generations):
    return create_app(ServeConfig("edge-builtin", max_body_bytes=MAX_BODY_BYTES), generations)


def gateway(forward) -> ReplicaGateway:
    return ReplicaGateway(forward, lambda error: LOST if isinstance(error, ReplicaDied) else None, MAX_BODY_BYTES)


def post(asgi_app, body: dict | bytes, path: str = "/v1/completions") -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=asgi_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return await client.post(path, content=content, headers={"content-type": "application/json"})

    return asyncio.run(send())


def events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]


COMPLETION = {"model": "edge", "prompt": "The json module", "max_tokens": 12, "temperature": 0}


def test_a_request_through_the_gateway_gets_the_apps_own_reply(app):
    through = gateway(lambda request: served(app, request))
    direct, forwarded = post(app, COMPLETION), post(through, COMPLETION)
    assert forwarded.status_code == direct.status_code == 200
    assert forwarded.json()["choices"] == direct.json()["choices"]
    streamed = events(post(through, {**COMPLETION, "stream": True}))
    assert streamed[-1] == "[DONE]"
    assert "".join(json.loads(event)["choices"][0]["text"] for event in streamed[:-1]) == \
        direct.json()["choices"][0]["text"]
    unknown = post(through, COMPLETION, path="/v1/nothing")  # the app's own errors come through as they are
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    too_large = post(through, b'{"prompt": "' + b"x" * 2 * MAX_BODY_BYTES + b'"}')  # read only past the limit
    assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "request_too_large"


def test_a_replica_lost_before_its_reply_gets_a_503_with_retry_after():
    async def lost(request: ForwardedRequest):
        raise ReplicaDied()
        yield  # an async generator, as a replica's reply is

    response = post(gateway(lost), COMPLETION)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "replica_lost"


def test_a_replica_lost_mid_stream_ends_the_stream_with_an_error_event_then_done(app):
    async def lost_after_two_tokens(request: ForwardedRequest):
        sent = 0
        async for message in served(app, request):
            yield message
            sent += message["type"] == "http.response.body"
            if sent == 2:
                raise ReplicaDied()

    response = post(gateway(lost_after_two_tokens), {**COMPLETION, "stream": True})
    assert response.status_code == 200
    sent = events(response)
    assert len(sent) == 4 and sent[-1] == "[DONE]"
    assert json.loads(sent[-2])["error"]["code"] == "replica_lost"
    assert all("choices" in json.loads(event) for event in sent[:2])


def stopped(generations) -> int:
    return generations.replies().get("stopped", 0)


def test_a_reply_left_early_stops_its_generation(app, generations):
    body = {**COMPLETION, "max_tokens": 1900, "ignore_eos": True, "stream": True}
    request = ForwardedRequest("POST", "/v1/completions", b"", ((b"host", b"localhost"),
                                                               (b"content-type", b"application/json")),
                               json.dumps(body).encode())
    deadline = time.monotonic() + 20
    while generations.generating or generations.waiting:  # the tests before may leave a generation stopping
        assert time.monotonic() < deadline, "the server stayed busy"
        time.sleep(0.05)
    before = stopped(generations)

    async def read_two_then_leave() -> None:
        replies = served(app, request)
        assert (await anext(replies))["status"] == 200
        await anext(replies)
        await replies.aclose()  # what the gateway does when its client goes away
        deadline = time.monotonic() + 20
        while stopped(generations) == before:  # the loop runs on meanwhile, as a replica's does
            assert time.monotonic() < deadline, "the generation did not stop"
            await asyncio.sleep(0.05)

    asyncio.run(read_two_then_leave())


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "2"], "--replicas runs replicas on a Ray cluster: add --ray ADDRESS"),
    (["--ray", "auto", "--replicas", "0"], "--replicas must be at least 1, got 0"),
    (["--ray", "auto", "--replicas", "3", "--max-replicas", "2"], "--max-replicas must be at least --replicas (3)"),
])
def test_the_ray_flags_are_checked_before_anything_loads(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_ray_without_the_cluster_extra_says_how_to_install_it(builtin_default, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as where Ray is not installed
    assert main(["--ray", "auto"]) == 2
    assert "pip install 'edge[cluster]'" in capsys.readouterr().err


def test_ray_at_an_address_nobody_listens_at_is_one_line(builtin_default, capsys):
    pytest.importorskip("ray.serve", reason="the cluster extra is not installed (pip install -e '.[cluster]')")
    with socket.socket() as probe:  # a free port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["--ray", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"no Ray cluster at 127.0.0.1:{port}" in err and "ray start --head" in err
