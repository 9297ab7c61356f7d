"""edge-serve's structured output and tool calls through the official openai client: json_schema replies parse and
validate, tool calls round-trip (tools sent, tool_calls back, the result sent, a reply), streamed and whole, and a
greedy reply equals Engine.chat's with the same constraint."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel

from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.load_spec import LoadSpec
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer
# fixtures: an openai client of this module's server, plain decoding
from tests.serve.test_serve import client, reference  # noqa: F401

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                          "parameters": {"type": "object", "properties": {},
                                                         "additionalProperties": False}}}
STEPS = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20},
                                          "steps": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                    "minItems": 1, "maxItems": 3},
                                          "done": {"type": "boolean"}},
         "required": ["title", "steps", "done"], "additionalProperties": False}
ASK = [{"role": "user", "content": "How do I sort a list? Answer as JSON."}]


@pytest.fixture(scope="module")
def server():
    spec = LoadSpec.from_options(builtin_model_path(), drafter="hybrid:feature")
    with BackgroundServer(lambda: Engine.from_spec(spec), ServeConfig("edge-builtin")) as running:
        running.generations.loaded.wait(60)
        yield running




def engine_text(events) -> str:
    events = list(events)
    return "".join(event.text for event in events)


def test_json_schema_reply_validates_and_equals_engine_chat(client, reference):
    response_format = {"type": "json_schema", "json_schema": {"name": "steps", "schema": STEPS, "strict": True}}
    reply = client.chat.completions.create(model="any", messages=ASK, max_tokens=120, temperature=0,
                                           response_format=response_format)
    content = reply.choices[0].message.content
    jsonschema.validate(json.loads(content), STEPS)
    assert reply.choices[0].finish_reason == "stop"
    assert content == engine_text(reference.chat(ASK, max_new_tokens=120, response_format=response_format, temperature=0.0))


def test_the_clients_parse_helper_gets_its_pydantic_model(client):
    class Plan(BaseModel):
        title: str
        done: bool

    reply = client.chat.completions.parse(model="any", messages=ASK, max_tokens=120, temperature=0,
                                          response_format=Plan)
    assert isinstance(reply.choices[0].message.parsed, Plan)


def test_streamed_json_object_is_one_json_object(client, reference):
    chunks = list(client.chat.completions.create(model="any", messages=ASK, max_tokens=120, temperature=0,
                                                 stream=True, response_format={"type": "json_object"}))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert isinstance(json.loads(text), dict)
    assert text == engine_text(reference.chat(ASK, max_new_tokens=120, response_format={"type": "json_object"}, temperature=0.0))


def test_an_unsupported_schema_feature_is_a_400_naming_it(client):
    import openai

    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="any", messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in error.value.body["message"] and error.value.body["param"] == "response_format"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_call_round_trip(client, tool_choice):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model="any", messages=messages, max_tokens=80, temperature=0,
                                           tools=[WEATHER, CLOCK], tool_choice=tool_choice)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    if isinstance(tool_choice, dict):
        assert call.function.name == "get_weather"
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    answer = client.chat.completions.create(model="any", messages=messages, max_tokens=24, temperature=0,
                                            tools=[WEATHER, CLOCK], tool_choice="none")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_streamed_tool_calls_come_as_delta_tool_calls(client):
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    whole = client.chat.completions.create(model="any", messages=messages, max_tokens=80, temperature=0,
                                           tools=[WEATHER], tool_choice="required")
    chunks = list(client.chat.completions.create(model="any", messages=messages, max_tokens=80, temperature=0,
                                                 tools=[WEATHER], tool_choice="required", stream=True))
    deltas = [chunk.choices[0] for chunk in chunks if chunk.choices]
    calls = [call for choice in deltas for call in choice.delta.tool_calls or []]
    assert [call.index for call in calls] == [0]
    assert calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == whole.choices[0].message.tool_calls[0].function.arguments
    assert deltas[-1].finish_reason == "tool_calls"
    assert not "".join(choice.delta.content or "" for choice in deltas)


def test_tools_with_auto_choice_answer_in_text_when_the_model_writes_no_call(client, reference):
    """The built-in model was not trained on tools: it answers in text, which streams as content."""
    messages = [{"role": "user", "content": "How do I sort a list?"}]
    reply = client.chat.completions.create(model="any", messages=messages, max_tokens=32, temperature=0,
                                           tools=[WEATHER])
    assert reply.choices[0].finish_reason == "length" and not reply.choices[0].message.tool_calls
    assert reply.choices[0].message.content == engine_text(reference.chat(messages, max_new_tokens=32,
                                                                          tools=[WEATHER], temperature=0.0))


@pytest.mark.parametrize("schema, cycle", [
    ({"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
                "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}},
      "$ref": "#/$defs/A"}, "#/$defs/A → #/$defs/A/properties/b → #/$defs/B → #/$defs/B/properties/a → #/$defs/A"),
    ({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, "# → #/properties/next → #"),
    ({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"},
     "#/$defs/A → #/$defs/B → #/$defs/A"),
])
def test_a_schema_without_a_finite_instance_is_a_400_naming_its_cycle(client, schema, cycle):
    import openai

    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="any", messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    body = error.value.body
    assert body["param"] == "response_format" and body["code"] == "invalid_response_format"
    assert f"has no finite instance: its $refs form a cycle every instance must follow ({cycle})" in body["message"]
    assert "token" not in body["message"]
