"""edge-serve's refusals: OpenAI-style JSON errors with the right 4xx status, never a traceback, a 500 or a dead
server; the API key, checked on every route but /health."""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest
from openai import OpenAI

from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.frontend.options import load_spec
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer
from edge.frontend.options import default_drafter
from edge.serve.cli import build_parser, serve_config

CONTEXT = 128  # tokens: a prompt longer than this is refused
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(lambda: Engine.load(builtin_model_path(), max_context=CONTEXT), ServeConfig("m")) as running:
        running.generations.loaded.wait(60)
        yield running


def post(server, path: str, body, **options) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, **options)
    return httpx.post(server.url + path, json=body, **options)


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in error["message"] and "\n" not in error["message"]
    return error


@pytest.mark.parametrize("path, body, param", [
    (CHAT, b"{not json", None),
    (CHAT, b"", None),
    (CHAT, b"\xff\xfe\x00", None),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', None),
    (CHAT, "[1, 2]", None),
    (CHAT, {}, "messages"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": USER, "unknown_field": 1}, "unknown_field"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user"}]}, "messages[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": "x", "mood": "happy"}]}, "messages[0].mood"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
     "messages[0].content"),
    (CHAT, {"messages": "Hi"}, "messages"),
    (CHAT, {"messages": USER, "temperature": 2.5}, "temperature"),
    (CHAT, {"messages": USER, "temperature": -0.1}, "temperature"),
    (CHAT, {"messages": USER, "temperature": "hot"}, "temperature"),
    (CHAT, {"messages": USER, "top_p": 0}, "top_p"),
    (CHAT, {"messages": USER, "top_p": 1.5}, "top_p"),
    (CHAT, {"messages": USER, "max_tokens": 0}, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 2.5}, "max_tokens"),
    (CHAT, {"messages": USER, "max_completion_tokens": -1}, "max_completion_tokens"),
    (CHAT, {"messages": USER, "n": 2}, "n"),
    (CHAT, {"messages": USER, "seed": 2**70}, "seed"),
    (CHAT, {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (CHAT, {"messages": USER, "stop": [""]}, "stop"),
    (CHAT, {"messages": USER, "stop": 3}, "stop"),
    (CHAT, {"messages": USER, "stream": "yes"}, "stream"),
    (CHAT, {"messages": USER, "logprobs": True}, "logprobs"),
    (CHAT, {"messages": USER, "presence_penalty": 0.5}, "presence_penalty"),
    (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, "tools[0].function"),
    (CHAT, {"messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": {"not": {}}}}}, "response_format"),
    (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, "response_format"),
    (CHAT, {"messages": [{"role": "assistant"}, *USER]}, "messages[0].content"),
    (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}}, None),
    (CHAT, {"messages": USER, "repetition_penalty": 0}, "repetition_penalty"),
    (TEXT, {"prompt": ["one", "two"]}, "prompt"),
    (TEXT, {"prompt": 5}, "prompt"),
    (TEXT, {"prompt": "x", "echo": True}, "echo"),
    (TEXT, {"prompt": "x", "best_of": 3}, "best_of"),
    (TEXT, {"prompt": "x", "top_k": -1}, "top_k"),
    (TEXT, {"prompt": "x", "min_p": 2}, "min_p"),
    (TEXT, {"prompt": "x", "stream_options": {"include_usage": True, "extra": 1}}, "stream_options.extra"),
])
def test_a_bad_request_is_a_400_naming_the_field(server, path, body, param):
    error = assert_openai_error(post(server, path, body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize("path, body, param", [
    (CHAT, {"messages": [{"role": "user", "content": "word " * 300}]}, "messages"),
    (TEXT, {"prompt": "word " * 300}, "prompt"),
    (TEXT, {"prompt": list(range(CONTEXT + 5))}, "prompt"),
])
def test_a_prompt_longer_than_the_context_is_context_length_exceeded(server, path, body, param):
    for stream in (False, True):
        error = assert_openai_error(post(server, path, {**body, "stream": stream}), 400)
        assert error["code"] == "context_length_exceeded" and error["param"] == param


@pytest.mark.parametrize("body", [
    {"prompt": ""},
    {"prompt": [10**9]},
    {"prompt": [-1]},
    b'{"prompt": "\\ud800 a lone surrogate"}',  # valid JSON, not valid Unicode
])
def test_prompts_the_engine_refuses_are_400s(server, body):
    assert_openai_error(post(server, TEXT, body), 400)


@pytest.mark.parametrize("extreme", [
    {"temperature": 1e-203},  # greedy, its limit (dividing float32 logits by it would overflow)
    {"temperature": 1.0, "top_p": 1e-203},  # the one most likely token, as any top_p this small
    {"temperature": 2.0, "repetition_penalty": 0.01, "top_k": 1},
    {"temperature": 2.0, "repetition_penalty": 100, "min_p": 1.0},
])
def test_extreme_sampling_values_in_range_are_served(server, extreme):
    reply = post(server, TEXT, {"prompt": "The json module", "max_tokens": 4, **extreme})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4


def test_the_openai_client_sees_a_bad_request_error(server):
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="m", messages=USER, temperature=3)
    assert raised.value.status_code == 400 and "temperature" in raised.value.message


def test_unknown_routes_and_methods_are_openai_errors(server):
    assert assert_openai_error(httpx.get(server.url + "/v1/engines"), 404)["type"] == "not_found_error"
    assert_openai_error(httpx.get(server.url + CHAT), 405)
    assert assert_openai_error(httpx.get(server.url + "/v1/models/other"), 404)["code"] == "model_not_found"


def test_an_oversized_body_is_a_413(server):
    limited = dataclasses.replace(ServeConfig("m"), max_body_bytes=1000)
    with BackgroundServer(lambda: server.generations.engine, limited) as small:
        small.generations.loaded.wait(10)
        assert_openai_error(post(small, TEXT, {"prompt": "x" * 2000}), 413)


def test_json_nested_past_the_readers_limit_is_named_so(server):
    error = assert_openai_error(post(server, CHAT, "[" * 100_000 + "]" * 100_000), 400)
    assert "nests arrays or objects deeper" in error["message"] and "recursion" not in error["message"]


def test_the_server_answers_after_every_refusal(server):
    reply = post(server, TEXT, {"prompt": "The json module", "max_tokens": 3})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_chat_without_a_chat_template_points_to_completions(base_dir):
    with BackgroundServer(lambda: Engine.load(base_dir), ServeConfig("base")) as plain:
        plain.generations.loaded.wait(30)
        error = assert_openai_error(post(plain, CHAT, {"messages": USER}), 400)
        assert error["code"] == "no_chat_template" and "/v1/completions" in error["message"]
        assert post(plain, TEXT, {"prompt": "The quick brown fox", "max_tokens": 3}).status_code == 200


def test_a_chat_template_file_from_the_command_line_serves_chat(base_dir, tmp_path):
    template = tmp_path / "chatml.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    args = build_parser().parse_args([str(base_dir), "--chat-template", str(template)])
    spec = load_spec(args, default_drafter(args))
    with BackgroundServer(lambda: Engine.from_spec(spec), serve_config(args)) as templated:
        templated.generations.loaded.wait(30)
        reply = post(templated, CHAT, {"messages": USER, "max_tokens": 6, "temperature": 0})
    expected = "".join(event.text for event in Engine.load(base_dir, chat_template=template).chat(USER,
                                                                                                   max_new_tokens=6,
                                                                                                   temperature=0.0))
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == expected


def test_the_api_key_is_required_everywhere_but_health(server):
    keyed = ServeConfig("m", api_key="s3cret")
    with BackgroundServer(lambda: server.generations.engine, keyed) as locked:
        locked.generations.loaded.wait(10)
        assert httpx.get(locked.url + "/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            error = assert_openai_error(httpx.get(locked.url + "/v1/models", headers=headers), 401)
            assert error["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=locked.url + "/v1", api_key="wrong", max_retries=0).models.list()
        client = OpenAI(base_url=locked.url + "/v1", api_key="s3cret", max_retries=0)
        assert client.completions.create(model="m", prompt="The os module", max_tokens=2).usage.completion_tokens == 2
