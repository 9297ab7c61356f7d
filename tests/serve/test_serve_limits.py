"""A request cannot freeze edge-serve or hold its one generation slot: prompts are bounded in characters (checked
before tokenizing, which holds the interpreter) and in tokens (the context) in a worker thread, before they are
queued."""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import pytest

from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer
from edge.serve.cli import build_parser, main, serve_config

CONTEXT = 128  # tokens; the default prompt limit is 16 characters per token: 2,048
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(lambda: Engine.load(builtin_model_path(), max_context=CONTEXT), ServeConfig("m")) as running:
        running.generations.loaded.wait(60)
        yield running


def test_a_10_mb_message_is_refused_before_tokenizing_and_health_answers_meanwhile(server):
    body = {"messages": [{"role": "user", "content": "word " * 2_000_000}], "max_tokens": 2}
    replies, probes = [], []
    sender = threading.Thread(target=lambda: replies.append(httpx.post(server.url + CHAT, json=body, timeout=120)))
    sender.start()
    while sender.is_alive():
        started = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        probes.append(time.monotonic() - started)
    sender.join()
    reply = replies[0]
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "string_above_max_length" and error["param"] == "messages"
    assert "10,000,000 characters, over the 2,048" in error["message"] and "--max-prompt-chars" in error["message"]
    assert max(probes, default=0) < 5  # generous: the event loop never waits on the big message
    assert server.generations.replies().get("refused", 0) == 0  # it never reached the generation queue


@pytest.mark.parametrize("path, body, param", [
    (CHAT, {"messages": [{"role": "user", "content": "word " * 300}]}, "messages"),  # 1,500 characters
    ("/v1/completions", {"prompt": "word " * 300}, "prompt"),
    ("/v1/completions", {"prompt": list(range(CONTEXT))}, "prompt"),
])
def test_a_prompt_over_the_context_is_refused_before_it_is_queued(server, path, body, param):
    before = server.generations.replies()
    reply = httpx.post(server.url + path, json=body, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
    assert reply.json()["error"]["param"] == param and "--max-context" in reply.json()["error"]["message"]
    assert server.generations.replies() == before  # no job: the generation slot was never taken


def test_the_character_limit_is_an_option(server):
    limited = dataclasses.replace(ServeConfig("m"), max_prompt_chars=10)
    with BackgroundServer(lambda: server.generations.engine, limited) as small:
        small.generations.loaded.wait(10)
        reply = httpx.post(small.url + "/v1/completions", json={"prompt": "The json module", "max_tokens": 2})
        assert reply.status_code == 400 and "over the 10 this server reads" in reply.json()["error"]["message"]
        assert httpx.post(small.url + "/v1/completions", json={"prompt": "The json", "max_tokens": 2}).status_code \
            == 200
    assert serve_config(build_parser().parse_args(["--max-prompt-chars", "5000"])).max_prompt_chars == 5000
    assert main(["--max-prompt-chars", "0"]) == 2


class EndlessEngine:
    """Streams 16 KB of text a step until told to stop, like a long reply on a big model."""

    def __init__(self, reference: Engine) -> None:
        self.tokenizer, self.max_context = reference.tokenizer, reference.max_context
        self.event = next(iter(reference.generate("The json module", max_new_tokens=1)))
        self.steps = 0

    def generate(self, prompt, options):
        if options.max_new_tokens < 100:  # a short request: answered as is
            yield self.event
            return
        while not options.should_stop():
            self.steps += 1
            time.sleep(0.002)
            yield dataclasses.replace(self.event, text="x" * 16384, finish_reason=None)
        yield dataclasses.replace(self.event, finish_reason="stopped")


@pytest.mark.slow
def test_a_client_that_stops_reading_is_cut_off_and_frees_the_slot(server):
    import socket

    engine = EndlessEngine(server.generations.engine)
    config = dataclasses.replace(ServeConfig("m"), write_timeout_s=0.5)
    with BackgroundServer(lambda: engine, config) as running:
        running.generations.loaded.wait(10)
        stalled = socket.create_connection((running.host, running.port))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = b'{"prompt": "The json module", "max_tokens": 100000, "stream": true}'
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # and then reads nothing
        try:
            deadline = time.monotonic() + 10
            while engine.steps == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            reply = httpx.post(running.url + "/v1/completions", json={"prompt": "The json", "max_tokens": 8},
                               timeout=60)
            assert reply.status_code == 200  # served once the stalled stream's write timed out
            assert running.generations.replies().get("stopped") == 1
        finally:
            stalled.close()
