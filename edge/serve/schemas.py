"""The request bodies edge-serve takes: the OpenAI API's fields, unknown ones refused, every value range-checked.

The generation options' fields (types, limits, descriptions) come from SamplingParams (edge/decoding/sampling.py),
as edge-serve's flags do, under OpenAI's names (`max_tokens` for max_new_tokens). A field left out (or null) takes the
server's default, which `edge-serve --temperature ...` and the other sampling flags set. Fields edge cannot honour
(n > 1, logprobs, penalties other than the repetition penalty) are refused with a message rather than ignored.
`top_k`, `min_p`, `repetition_penalty` and `ignore_eos` are edge's (and llama-server's) extensions; the openai client
sends them through `extra_body`. Chat requests take `response_format` (json_object, json_schema) and `tools` /
`tool_choice`, with tool calls and tool results in the messages (edge/decoding/constrained.py,
edge/decoding/tools.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator,
                      model_validator)

from edge.engine import GenerationOptions
from edge.decoding.sampling import OPTIONS, Limits
from edge.decoding.tools import TOOL_CHOICES

REQUEST_NAMES = {"max_new_tokens": "max_tokens"}  # OpenAI's names of the generation options edge names otherwise
# text-completion fields edge-serve accepts only at their do-nothing values
ACCEPTED_COMPLETION_VALUES = {"echo": (False,), "suffix": (None,), "best_of": (None, 1), "logprobs": (None, 0)}


class Body(BaseModel):
    """JSON types as written (no "1" for 1, no true for 1), finite numbers, no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(Body):
    include_usage: bool = False


def request_field(limits: Limits) -> tuple[Any, Any]:
    """A generation option as a request field: its type, null for the server's default, its limits as constraints."""
    bounds = {"gt" if limits.above_low else "ge": limits.low, "le": limits.high}
    kind = tuple[str, ...] if limits.kind is str else limits.kind
    return kind | None, Field(None, description=limits.usage(),
                              **{bound: value for bound, value in bounds.items() if value is not None})


# every generation option SamplingParams declares, under its OpenAI name
GenerationFields = create_model("GenerationFields", __base__=Body, **{
    REQUEST_NAMES.get(name, name): request_field(limits) for name, limits in OPTIONS.items()})


class SamplingRequest(GenerationFields):
    """The fields chat and text completions share: the generation options (top_k, min_p and repetition_penalty are
    edge's extensions, with the names llama-server takes) and the API's own."""

    model: str | None = None  # any name is accepted: edge-serve serves the one model it loaded
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    ignore_eos: bool = False  # an extension, as llama-server's

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> tuple[str, ...] | None:
        """One string or a list of them, within the limits of SamplingParams' stop."""
        if value is None:
            return None
        strings = tuple(value) if isinstance(value, list) else (value,) if isinstance(value, str) else value
        OPTIONS["stop"].check(strings, "stop")  # a SamplingError, which is a ValueError: a 400 naming stop
        return strings

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("edge-serve returns one choice per request: leave n out or send 1")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value not in (None, 0):
            raise ValueError("this penalty is not supported: leave it out or send 0 (edge-serve takes "
                             "repetition_penalty instead)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict | None) -> dict | None:
        if value:
            raise ValueError("logit_bias is not supported: leave it out")
        return value

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    def generation_options(self, defaults: GenerationOptions) -> GenerationOptions:
        """The engine's options: what the request sets, the server's defaults for the rest."""
        asked = {name: getattr(self, REQUEST_NAMES.get(name, name)) for name in OPTIONS}
        asked.update(max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos or None)
        asked = {name: value for name, value in asked.items() if value is not None}
        return GenerationOptions.merged(defaults, asked)  # temperature 0 without a penalty: none (asked_over)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class FunctionCall(Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallItem(Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Function(Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Body):
    type: Literal["function"]
    function: Function


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers
    refusal: str | None = None
    # None (or left out) only in an assistant turn that calls tools; after the fields above, which it checks
    content: str | None = Field(None, validate_default=True)

    @field_validator("content", mode="before")
    @classmethod
    def _text_content(cls, value: Any, info: ValidationInfo) -> str | None:
        """A string, or a list of text parts ({"type": "text", "text": ...}), joined by newlines."""
        if value is None:
            if info.data.get("role") == "assistant" and info.data.get("tool_calls"):
                return None
            raise ValueError("content is required (only an assistant message with tool_calls may leave it out)")
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(part, dict) and part.keys() == {"type", "text"}
                                           and part["type"] == "text" and isinstance(part["text"], str)
                                           for part in value):
            return "\n".join(part["text"] for part in value)
        raise ValueError('content must be a string or a list of text parts ({"type": "text", "text": "..."}); '
                         "edge-serve takes text only")

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it ("developer" is OpenAI's newer name for "system"), with its tool
        calls or the call it answers (edge/decoding/tools.py writes them for templates that do not know tools)."""
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            message["name"] = self.name
        return message


class FunctionName(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None  # "auto", "none", "required" or a named function
    parallel_tool_calls: bool | None = None  # accepted; a forced call is one call
    # text, json_object or json_schema: edge/decoding/constrained.py checks it
    response_format: dict[str, Any] | None = None
    # edge's own: special-token strings in the messages' content (`<|im_end|>`) become control tokens, as
    # transformers encodes them; by default they are text, so that a message cannot forge another role's turn
    special_tokens_in_messages: bool = False

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("logprobs are not supported: leave it out or send false")
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value is None or value in TOOL_CHOICES:
            return value
        if isinstance(value, dict):
            try:
                return NamedToolChoice.model_validate(value)
            except ValidationError:
                pass
        raise ValueError("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}")

    @model_validator(mode="after")
    def _choice_among_tools(self) -> "ChatCompletionRequest":
        names = [tool.function.name for tool in self.tools or ()]
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools "
                             f"({', '.join(names) or 'none sent'}); add it to tools or name another")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools: send the tools the model may call")
        return self

    def tool_list(self) -> list[dict] | None:
        """The tools as Engine.chat takes them (OpenAI's dicts)."""
        return [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None

    def tool_choice_value(self) -> str | dict | None:
        choice = self.tool_choice
        return choice.model_dump() if isinstance(choice, NamedToolChoice) else choice

    def generation_options(self, defaults: GenerationOptions) -> GenerationOptions:
        options = super().generation_options(defaults)
        return dataclasses.replace(options, response_format=self.response_format)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def template_messages(self) -> list[dict[str, str]]:
        return [message.for_template() for message in self.messages]


class CompletionRequest(SamplingRequest):
    prompt: str | tuple[int, ...]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | tuple[int, ...]:
        """One prompt: text, or token ids (also each as the only item of a list, as the API's batch form)."""
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
            value = value[0]
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(type(token) is int for token in value):
            return tuple(value)
        raise ValueError("prompt must be one string or one list of token ids (one prompt per request)")

    @field_validator("echo", "suffix", "best_of", "logprobs")
    @classmethod
    def _unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in ACCEPTED_COMPLETION_VALUES[info.field_name]:
            raise ValueError(f"{info.field_name} is not supported: leave it out")
        return value
