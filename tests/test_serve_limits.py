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
from edge.builtin import builtin_model_path
from serve.app import ServeConfig
from serve.background import BackgroundServer
from serve.cli import build_parser, main, serve_config

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
