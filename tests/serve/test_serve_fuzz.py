"""Fuzzed request bodies against the real server (hypothesis): every answer is a reply or an OpenAI-style 4xx error,
never a 500, and the server keeps answering. Bounded: short replies on a short context, ~50 examples a test."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from edge import Engine, GenerationOptions
from edge.sources.builtin import builtin_model_path
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer

pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

any_text = st.text(st.characters(exclude_categories=()), max_size=12)  # lone surrogates included
scalars = st.none() | st.booleans() | st.integers(-3, 20) | st.integers() | st.floats() | any_text
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(any_text, inner, max_size=3), max_leaves=6)
words = st.sampled_from(["The json module", "What does os do?", "def main():", "x", ""]) | any_text
roles = st.sampled_from(["system", "developer", "user", "assistant"])
# plausible: every value in range, edge cases included (bounds, lone surrogates, stop strings, token ids), so that
# most bodies reach the engine; wild: anything JSON holds in any field, and unknown fields
plausible = {
    "model": any_text,
    "max_tokens": st.integers(1, 12),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1, exclude_min=True),
    "top_k": st.integers(0, 50),
    "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0.01, 100),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": any_text.filter(bool) | st.lists(any_text.filter(bool), max_size=4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(),
}
wild = {name: json_values for name in [*plausible, "n", "logprobs", "user", "surprise", "echo", "suffix"]}
messages = st.lists(st.fixed_dictionaries({"role": roles, "content": words}), min_size=1, max_size=3)
chat_bodies = (st.fixed_dictionaries({"messages": messages}, optional=plausible)
               | st.fixed_dictionaries({"messages": messages | json_values}, optional=wild))
prompts = words | st.lists(st.integers(-5, 400), max_size=8)
text_bodies = (st.fixed_dictionaries({"prompt": prompts}, optional=plausible)
               | st.fixed_dictionaries({"prompt": prompts | json_values}, optional=wild))


@pytest.fixture(scope="module")
def server():
    config = ServeConfig("fuzz", defaults=GenerationOptions(max_new_tokens=8))
    with BackgroundServer(lambda: Engine.load(builtin_model_path(), max_context=96), config) as running:
        running.generations.loaded.wait(60)
        yield running
        assert httpx.get(running.url + "/health").json()["status"] == "ok"  # alive after all of it
        assert running.generations.replies().get("failed", 0) == 0


def check(response: httpx.Response) -> None:
    event(f"status {response.status_code}")  # pytest --hypothesis-show-statistics: how many got through
    assert response.status_code in (200, 400, 413), response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
        assert events[-1] == "[DONE]"
        assert all("error" not in json.loads(event) for event in events[:-1])
    else:
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def send(server, path: str, body: bytes) -> httpx.Response:
    return httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)


@FUZZ
@given(body=chat_bodies)
def test_fuzzed_chat_requests(server, body):
    check(send(server, "/v1/chat/completions", json.dumps(body).encode()))


@FUZZ
@given(body=text_bodies)
def test_fuzzed_text_requests(server, body):
    check(send(server, "/v1/completions", json.dumps(body).encode()))


@FUZZ
@given(body=st.binary(max_size=64) | json_values.map(lambda value: json.dumps(value).encode()))
def test_fuzzed_bytes(server, body):
    check(send(server, "/v1/chat/completions", body))
