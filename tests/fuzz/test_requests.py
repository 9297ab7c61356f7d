"""Fuzzed request bodies against edge-serve's app, in process (FastAPI's TestClient) on the built-in model: any JSON on
the chat and text completion routes; chats asking for `response_format` with any JSON schema (keywords nested in
any way, `$ref`s to `$defs` that may form cycles, wild values); tools whose parameters are such schemas, with any
tool_choice. Each answer is a 2xx or a 4xx whose body is an OpenAI-style JSON error, never a 500, within the time
limit; a whole reply under a schema that stopped by itself holds JSON valid under that schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient
from hypothesis import event
from hypothesis import strategies as st

from edge import Engine, GenerationOptions
from edge.serve.app import ServeConfig, create_app
from edge.serve.generation_queue import GenerationQueue
from edge.sources.builtin import builtin_model_path
from tests.fuzz import harness
from tests.serve.test_serve_fuzz import any_text, chat_bodies, json_values, messages, text_bodies

LIMIT_S = 30.0  # a reply of at most 12 tokens on the built-in model takes well under a second
TYPES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null"])
NAMES = st.sampled_from(["a", "b", "name", "x y", ""]) | any_text
REFS = st.sampled_from(["#/$defs/a", "#/$defs/b", "#", "#/properties/a", "#/$defs/missing", "a", ""]) | any_text
SMALL = st.integers(-2, 12) | st.integers()
NUMBERS = SMALL | st.floats()
PATTERNS = st.sampled_from(["^[a-z]+$", "[0-9]{2,4}", "(a|b)*c", "(a+)+$", "\\d", "[", ".*", ""]) | any_text
FORMATS = st.sampled_from(["date-time", "date", "time", "email", "uri", "uuid", "ipv4", "hostname", "nonsense"])
leaf_schemas = st.booleans() | st.fixed_dictionaries({}, optional={
    "type": TYPES | st.lists(TYPES, max_size=3), "minLength": SMALL, "maxLength": SMALL, "pattern": PATTERNS,
    "format": FORMATS, "enum": st.lists(json_values, max_size=3), "const": json_values, "minimum": NUMBERS,
    "maximum": NUMBERS, "exclusiveMinimum": NUMBERS, "multipleOf": NUMBERS, "$ref": REFS,
    "description": any_text})


def nested_schemas(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={
        "type": TYPES, "properties": st.dictionaries(NAMES, inner, max_size=3), "required": st.lists(NAMES, max_size=3),
        "additionalProperties": st.booleans() | inner, "items": inner, "prefixItems": st.lists(inner, max_size=2),
        "minItems": SMALL, "maxItems": SMALL, "uniqueItems": st.booleans(), "anyOf": st.lists(inner, max_size=3),
        "oneOf": st.lists(inner, max_size=2), "allOf": st.lists(inner, max_size=2), "not": inner, "$ref": REFS,
        "minProperties": SMALL, "maxProperties": SMALL})


schemas = st.recursive(leaf_schemas, nested_schemas, max_leaves=8)
rooted_schemas = st.tuples(schemas, st.dictionaries(st.sampled_from(["a", "b"]), schemas, max_size=2)).map(
    lambda pair: {**pair[0], "$defs": pair[1]} if isinstance(pair[0], dict) and pair[1] else pair[0])
response_formats = st.one_of(
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
        {"name": st.just("reply") | any_text, "schema": rooted_schemas | json_values}, optional={"strict": st.booleans()})}),
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["json_object", "text"]) | json_values}),
    json_values,
)
tools = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "f"]) | any_text},
    optional={"description": any_text, "parameters": rooted_schemas | json_values})}) | json_values, max_size=2)
tool_choices = st.sampled_from(["auto", "none", "required"]) | st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.just("get_weather") | any_text})}) \
    | json_values
schema_bodies = st.fixed_dictionaries(
    {"messages": messages, "response_format": response_formats},
    optional={"max_tokens": st.integers(1, 12), "stream": st.booleans(), "temperature": st.floats(0, 2)})
tool_bodies = st.fixed_dictionaries(
    {"messages": messages, "tools": tools},
    optional={"tool_choice": tool_choices, "max_tokens": st.integers(1, 12), "stream": st.booleans(),
              "temperature": st.floats(0, 2)})
requests = st.one_of(
    st.tuples(st.just("/v1/chat/completions"), chat_bodies),
    st.tuples(st.just("/v1/completions"), text_bodies),
    st.tuples(st.just("/v1/chat/completions"), schema_bodies), st.tuples(st.just("/v1/chat/completions"), schema_bodies),
    st.tuples(st.just("/v1/chat/completions"), tool_bodies),
)


@pytest.fixture(scope="module")
def client():
    generations = GenerationQueue(16)
    app = create_app(ServeConfig("fuzz", defaults=GenerationOptions(max_new_tokens=8)), generations)
    generations.start(lambda: Engine.load(builtin_model_path(), max_context=96))
    assert generations.loaded.wait(120) and generations.engine is not None, generations.load_error
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        yield client
    generations.close()
    generations.stop()


def asked_schema(body: dict) -> object:
    """The JSON schema a chat body's response_format asks for (None when it asks for none)."""
    wanted = body.get("response_format")
    if not isinstance(wanted, dict) or wanted.get("type") != "json_schema":
        return None
    spec = wanted.get("json_schema")
    return spec.get("schema") if isinstance(spec, dict) else None


def check(response, body: dict) -> None:
    event(f"status {response.status_code}")
    assert 200 <= response.status_code < 300 or 400 <= response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and "\n" not in error["message"], error
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
        assert events[-1] == "[DONE]" and all("error" not in json.loads(item) for item in events[:-1]), events
        return
    choice = response.json()["choices"][0]
    if choice["finish_reason"] == "stop" and isinstance(schema := asked_schema(body), (dict, bool)):
        # "valid JSON" is valid (a schema the metaschema would refuse, `prefixItems: []`, is taken as it is)
        reply = json.loads(choice["message"]["content"])
        try:
            jsonschema.validators.validator_for(schema)(schema).validate(reply)
        except RecursionError:  # jsonschema's own limit: `anyOf: [{$ref: "#"}, ...]` recurses on one instance
            event("a reply jsonschema cannot check")
            return
        event("a reply valid under its schema")


def test_a_fuzzed_request_is_answered_or_refused_with_a_json_4xx(client):
    harness.cap_memory()

    def one_request(request):
        path, body = request
        with harness.limited(LIMIT_S, request):
            check(client.post(path, content=json.dumps(body).encode(),
                              headers={"Content-Type": "application/json"}), body)

    harness.run(one_request, request=requests)
    assert client.get("/health").json()["status"] == "ok"  # alive after all of it
