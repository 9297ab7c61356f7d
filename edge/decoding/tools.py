"""Tool calls: the prompt that offers tools, the grammar that forces a call, and the parser that reads calls back.

    plan = plan_tool_use(tokenizer, messages, tools, tool_choice)   # messages + template keywords + grammar
    content, calls = parse_tool_calls(reply_text, tools)              # OpenAI's tool_calls, arguments as JSON text

A chat template that renders `tools` (transformers' convention: Qwen, Hermes, SmolLM3, Llama 3.1, Mistral) gets
them as they are, and the conversation's earlier calls and results as its messages; a template that does not gets a
system message listing the tools and asking for Hermes' `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
and the earlier calls and results written in that format. `tool_choice` "required" or a named function constrains
the reply to one JSON object {"name": ..., "arguments": {...}} by grammar (edge/decoding/constrained.py); "auto" lets
the model choose, and the parser reads the formats models write: `<tool_call>` blocks, a bare JSON call or a list of
them (Llama 3.1's "parameters" too), Mistral's `[TOOL_CALLS]`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from edge.decoding.constrained import Grammar, GrammarError, json_schema_grammar

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_CALLS = "[TOOL_CALLS]"
_PROBE_TOOL = {"type": "function", "function": {"name": "edge_probe_tool_4f1d", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True)
class ToolPlan:
    messages: list[dict]
    template_kwargs: dict
    grammar: Grammar | None  # the reply must be a tool call (tool_choice required or named)
    parse: bool  # read tool calls from the reply (tools offered and tool_choice not "none")


def tool_names(tools: Sequence[dict] | None) -> list[str]:
    return [tool["function"]["name"] for tool in tools or ()]


def check_tools(tools: Any, tool_choice: Any) -> None:
    """GrammarError (one line) unless `tools` is OpenAI's list of functions and `tool_choice` one of its forms."""
    if tools is not None:
        if not isinstance(tools, (list, tuple)):
            raise GrammarError(f"tools must be a list of {{'type': 'function', 'function': {{...}}}}, got "
                               f"{type(tools).__name__}")
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)
                    and isinstance(function.get("name"), str) and function["name"]):
                raise GrammarError(f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., "
                                   "'parameters': {...}}}}")
            if not isinstance(function.get("parameters", {}), dict):
                raise GrammarError(f"tools[{index}].function.parameters must be a JSON schema object")
    if tool_choice is None or tool_choice in TOOL_CHOICES:
        if tool_choice == "required" and not tools:
            raise GrammarError("tool_choice 'required' needs tools; send the tools the model may call")
        return
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(name, str)):
        raise GrammarError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                           f"{{'name': ...}}}}, got {tool_choice!r}")
    if name not in tool_names(tools):
        raise GrammarError(f"tool_choice names the function {name!r}, which is not in tools "
                           f"({', '.join(tool_names(tools)) or 'none sent'}); add it to tools or name another")


def call_grammar(tools: Sequence[dict], name: str | None = None) -> Grammar:
    """One JSON object {"name": NAME, "arguments": {...}} whose arguments follow that tool's parameters; `name`
    picks one tool, else any of them."""
    options = [{"type": "object", "properties": {"name": {"const": tool["function"]["name"]},
                                                 "arguments": tool["function"].get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False}
               for tool in tools if name is None or tool["function"]["name"] == name]
    return json_schema_grammar(options[0] if len(options) == 1 else {"anyOf": options}, "tools")


def plan_tool_use(tokenizer: Any, messages: list[dict], tools: Sequence[dict] | None, tool_choice: Any) -> ToolPlan:
    """The messages and template keywords that offer `tools`, and the grammar `tool_choice` asks for."""
    check_tools(tools, tool_choice)
    history = any(message.get("tool_calls") or message.get("role") == "tool" for message in messages)
    if not tools and not history:
        return ToolPlan(messages, {}, None, False)
    native = renders_tools(tokenizer)
    messages = [_native_message(m) if native else _written_message(m) for m in messages]
    kwargs: dict = {}
    if tools:
        if native:
            kwargs["tools"] = list(tools)
        else:
            messages = _with_tool_prompt(messages, tools)
    grammar = None
    if tools and (tool_choice == "required" or isinstance(tool_choice, dict)):
        grammar = call_grammar(tools, tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None)
    return ToolPlan(messages, kwargs, grammar, bool(tools) and tool_choice != "none")


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes a `tools` list into the prompt (transformers' convention)."""
    probe = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tools=[_PROBE_TOOL])
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them; the real render reports
        return False
    return _PROBE_TOOL["function"]["name"] in text


def _arguments(call: dict) -> Any:
    """A call's arguments as a value (OpenAI sends JSON text; templates write them with tojson)."""
    arguments = call.get("function", call).get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _native_message(message: dict) -> dict:
    """A message for a template that knows tools: calls with their arguments as values, content never None."""
    message = dict(message)
    if message.get("tool_calls"):
        message["tool_calls"] = [{"id": call.get("id"), "type": "function",
                                  "function": {"name": call.get("function", call).get("name"),
                                               "arguments": _arguments(call)}} for call in message["tool_calls"]]
    if message.get("content") is None:
        message["content"] = ""
    return message


def _written_message(message: dict) -> dict:
    """A message for a template that does not know tools: calls written as <tool_call> blocks in the assistant's
    text, results as a user turn in <tool_response> blocks."""
    if message.get("role") == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}
    if not message.get("tool_calls"):
        return message
    calls = "".join(f"{CALL_OPEN}\n{json.dumps(_call_object(call))}\n{CALL_CLOSE}" for call in message["tool_calls"])
    rest = {key: value for key, value in message.items() if key != "tool_calls"}
    return {**rest, "content": (message.get("content") or "") + calls}


def _call_object(call: dict) -> dict:
    return {"name": call.get("function", call).get("name"), "arguments": _arguments(call)}


def tool_prompt(tools: Sequence[dict]) -> str:
    listed = "\n".join(json.dumps(tool["function"]) for tool in tools)
    return (f"Tools:\n<tools>\n{listed}\n</tools>\nTo call a tool, reply with only "
            f'{CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{CALL_CLOSE}; results come in <tool_response>.')


def _with_tool_prompt(messages: list[dict], tools: Sequence[dict]) -> list[dict]:
    prompt = tool_prompt(tools)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


# -- reading calls back --------------------------------------------------------------------------------------------

def parse_tool_calls(text: str, tools: Sequence[dict] | None) -> tuple[str, list[ToolCall]]:
    """The reply's text before its tool calls, and the calls (to the offered tools only); no calls: (text, [])."""
    names = set(tool_names(tools))
    if not names:
        return text, []
    if CALL_OPEN in text:
        head, _, rest = text.partition(CALL_OPEN)
        calls = []
        for block in rest.split(CALL_OPEN):
            call = _call(block.split(CALL_CLOSE)[0], names)
            if call is None:
                return text, []
            calls.append(call)
        return head.strip(), calls
    body = text.strip().removeprefix(MISTRAL_CALLS).strip()
    try:
        value = json.loads(body)
    except ValueError:
        return text, []
    objects = value if isinstance(value, list) and value else [value]
    calls = [_object_call(item, names) for item in objects]
    return ("", calls) if calls and all(calls) else (text, [])


def _call(text: str, names: set[str]) -> ToolCall | None:
    try:
        return _object_call(json.loads(text.strip()), names)
    except ValueError:
        return None


def _object_call(value: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


class ToolCallStream:
    """Streams a reply's text while holding back what may be a tool call, for `parse_tool_calls` at the end.

    `push(text)` returns the text that is surely content; `finish()` returns the rest of the content and the calls.
    Held back: a reply that opens like a call (`{`, `[`, `[TOOL_CALLS]`, `<tool_call>`), from its start, and from a
    `<tool_call>` on (with any text that may be the start of one)."""

    def __init__(self, tools: Sequence[dict] | None) -> None:
        self.tools = tools
        self.sent, self.held = "", ""
        self.calling = False  # a call has begun: hold everything to the end

    def push(self, text: str) -> str:
        self.held += text
        if self.calling:
            return ""
        if not self.sent and _may_open_call(self.held.lstrip()):
            return ""
        if CALL_OPEN in self.held:
            out, _, rest = self.held.partition(CALL_OPEN)
            self.held, self.calling = CALL_OPEN + rest, True
            return self._send(out)
        keep = max((n for n in range(1, len(CALL_OPEN)) if self.held.endswith(CALL_OPEN[:n])), default=0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
        return self._send(out)

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = parse_tool_calls(self.held, self.tools)
        if not calls:
            return self._send(self.held), []
        return self._send(content), calls

    def _send(self, text: str) -> str:
        self.sent += text
        return text


def _may_open_call(text: str) -> bool:
    """Whether a reply beginning with `text` may still turn out to be a tool call."""
    if not text:
        return True
    return text[0] in "{[" or CALL_OPEN.startswith(text[: len(CALL_OPEN)])
