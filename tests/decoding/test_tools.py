"""Tool calls: offered through the chat template when it renders tools, else a system prompt; forced by grammar; read
back from the formats models write, also from a stream cut anywhere."""

from __future__ import annotations

import json

import jsonschema
import pytest

from edge import Engine
from edge.decoding.constrained import GrammarError
from edge.events import FINISH_EOS
from edge.decoding.tools import ToolCallStream, parse_tool_calls, plan_tool_use
from tests.decoding.test_speculative import checkpoints, drafter_spec, ids_of  # noqa: F401 - checkpoints: a fixture

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                                          "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {},
                                                                               "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
# a Hermes-style template (Qwen 2.5's shape): tools in the system turn, calls and results in <tool_call> blocks
HERMES = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{%- if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message.content }}\n</tool_response><|im_end|>\n{%- else %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}{%- for call in message.tool_calls or [] %}<tool_call>\n"
    "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n"
    "</tool_call>{%- endfor %}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
HISTORY = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]


@pytest.mark.parametrize("text, names, arguments", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', ["get_weather"],
     [{"city": "Oslo"}]),
    ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", "arguments": '
     '{"city": "Rome"}}', ["get_time", "get_weather"], [{}, {"city": "Rome"}]),
    ('{"name": "get_weather", "parameters": {"city": "Kyiv"}}', ["get_weather"], [{"city": "Kyiv"}]),  # Llama 3.1
    ('[TOOL_CALLS] [{"name": "get_time", "arguments": {}}]', ["get_time"], [{}]),  # Mistral
    ('[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]', ["get_time"] * 2, [{}, {}]),
])
def test_tool_calls_are_read_from_the_formats_models_write(text, names, arguments):
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "" and [call.name for call in calls] == names
    assert [json.loads(call.arguments) for call in calls] == arguments
    assert len({call.id for call in calls}) == len(calls)


@pytest.mark.parametrize("text", ["Just text.", '{"name": "rm_rf", "arguments": {}}', '{"a": 1}',
                                  "<tool_call>not json</tool_call>", "[1, 2]"])
def test_text_that_is_no_call_to_an_offered_tool_stays_text(text):
    assert parse_tool_calls(text, TOOLS) == (text, [])
    assert parse_tool_calls(text, None) == (text, [])


@pytest.mark.parametrize("text, content", [
    ("Sure, it is sunny there.", "Sure, it is sunny there."),
    ('Let me look. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>', "Let me look."),
    ('{"name": "get_time", "arguments": {}}', ""),
    ("a <tool_ca b", "a <tool_ca b"),  # a partial tag that turns out not to be one
    ('{"x": 1}', '{"x": 1}'),
])
def test_a_stream_holds_back_only_what_may_be_a_call(text, content):
    for cut in range(len(text) + 1):
        stream = ToolCallStream(TOOLS)
        sent = stream.push(text[:cut]) + stream.push(text[cut:])
        rest, calls = stream.finish()
        assert (sent + rest).strip() == content and bool(calls) == (content != text), cut
    stream = ToolCallStream(TOOLS)
    if text[0] not in "{[" and "<tool_call>" not in text:
        assert stream.push(text)  # plain text is not held to the end


def test_a_template_that_renders_tools_gets_them_and_the_calls_as_messages(checkpoints):  # noqa: F811
    engine = Engine.load(checkpoints["target"], max_context=512, chat_template=None)
    engine.tokenizer.set_chat_template(HERMES)
    plan = plan_tool_use(engine.tokenizer, HISTORY, TOOLS, "auto")
    assert plan.template_kwargs == {"tools": TOOLS} and plan.grammar is None and plan.parse
    assert plan.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}  # a value for tojson
    text = engine.tokenizer.apply_chat_template(plan.messages, tools=TOOLS)
    assert '"name": "get_time"' in text and '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text
    assert "<tool_response>\n21 C\n</tool_response>" in text


def test_a_template_without_tools_gets_a_tool_prompt_and_written_calls(checkpoints):  # noqa: F811
    engine = Engine.load(checkpoints["target"], max_context=512)
    plan = plan_tool_use(engine.tokenizer, HISTORY, TOOLS, "required")
    assert plan.template_kwargs == {} and plan.grammar is not None
    assert plan.messages[0]["role"] == "system" and "get_time" in plan.messages[0]["content"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in \
        plan.messages[2]["content"]
    assert plan.messages[3] == {"role": "user", "content": "<tool_response>\n21 C\n</tool_response>"}
    assert plan_tool_use(engine.tokenizer, HISTORY[:1], TOOLS, "none").parse is False


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
@pytest.mark.parametrize("name", ["small", "early-exit:2", "ngram"])
def test_a_forced_tool_call_is_a_valid_call_and_speculation_keeps_it_exact(checkpoints, tool_choice, name):  # noqa: F811
    plain = Engine.load(checkpoints["target"], max_context=512)
    fast = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec(name, checkpoints))
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    events = list(plain.chat(messages, max_new_tokens=96, tools=TOOLS, tool_choice=tool_choice, temperature=0.0))
    assert events[-1].finish_reason == FINISH_EOS
    content, calls = parse_tool_calls("".join(event.text for event in events), TOOLS)
    assert content == "" and len(calls) == 1
    tool = {"get_weather": WEATHER, "get_time": CLOCK}[calls[0].name]
    jsonschema.validate(json.loads(calls[0].arguments), tool["function"]["parameters"])
    if isinstance(tool_choice, dict):
        assert calls[0].name == "get_time"
    assert ids_of(fast.chat(messages, max_new_tokens=96, tools=TOOLS, tool_choice=tool_choice, temperature=0.0)) == ids_of(events)


@pytest.mark.parametrize("tools, tool_choice, match", [
    (TOOLS, "sometimes", "tool_choice must be"),
    (None, "required", "needs tools"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not in tools"),
    ([{"type": "function"}], "auto", r"tools\[0\]"),
    ("get_time", "auto", "must be a list"),
])
def test_bad_tools_are_one_line_errors(checkpoints, tools, tool_choice, match):  # noqa: F811
    engine = Engine.load(checkpoints["target"], max_context=512)
    with pytest.raises(GrammarError, match=match):
        engine.chat([{"role": "user", "content": "hi"}], tools=tools, tool_choice=tool_choice)
