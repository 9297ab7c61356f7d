"""Render Hugging Face chat templates the way transformers does.

A checkpoint's chat template is a Jinja2 program that turns a list of chat messages into the prompt text the model
was trained on. transformers 4.57 (`apply_chat_template(tokenize=False)`) renders it in an immutable sandbox with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block, a `tojson` filter that
does not escape HTML, and the globals `raise_exception` and `strftime_now`. This module sets up the same environment,
so the text edge feeds the model is byte-for-byte the text transformers would produce.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from edge.errors import PromptError, TokenizerError

_FIX_HINT = "fix the messages to fit the template, or pass another chat template"


class _GenerationBlock(jinja2.ext.Extension):
    """Accept `{% generation %}...{% endgeneration %}` and render just its body.

    transformers uses the block to find which characters the assistant wrote (for training masks); for inference
    only the text matters, so the body is rendered unchanged.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        """Parse the block up to `{% endgeneration %}` into a call that renders the body."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller: jinja2.runtime.Macro) -> str:
        """Render the body of the block as is."""
        return caller()


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """The `tojson` filter: plain `json.dumps`, without Jinja's HTML escaping."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    """The `raise_exception(msg)` global templates call to refuse a conversation."""
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates use
    """The `strftime_now(fmt)` global: the current local time, formatted."""
    return datetime.now().strftime(format)


@lru_cache(maxsize=1)
def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """The one Jinja environment every template is compiled in (same settings as transformers)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _one_line(text: str) -> str:
    """Collapse whitespace so an error message stays on one line."""
    return " ".join(str(text).split())


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    """Compile a template once; later calls with the same source reuse it."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TokenizerError(
            f"chat template error: line {error.lineno}: {_one_line(error.message or error)}; "
            "fix the template (chat_template.jinja or tokenizer_config.json) or pass another chat template"
        ) from None


def read_template_file(path: str | Path) -> str:
    """The Jinja source of a chat template file a user supplies (--chat-template FILE), checked by `check_template`;
    every problem is one TokenizerError line naming the file."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TokenizerError(f"chat template file {path} does not exist; pass the path of a Jinja template") from None
    except IsADirectoryError:
        raise TokenizerError(f"chat template {path} is a folder; pass the template file itself (e.g. "
                             f"{path / 'chat_template.jinja'})") from None
    except UnicodeDecodeError as error:
        raise TokenizerError(f"chat template file {path} is not UTF-8 text (byte {error.start}); save the template "
                             "as UTF-8") from None
    except OSError as error:
        raise TokenizerError(f"cannot read chat template file {path}: {error.strerror or error}") from None
    check_template(source, f"chat template file {path}")
    return source


def check_template(source: str, origin: str) -> None:
    """Raise TokenizerError, one line naming `origin`, unless `source` is a template that compiles and renders a
    one-message chat."""
    if not isinstance(source, str) or not source.strip():
        raise TokenizerError(f"{origin} is empty; pass a Jinja chat template")
    try:
        _environment().from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TokenizerError(f"{origin}, line {error.lineno}: {_one_line(error.message or error)}; fix the "
                             "template") from None
    try:
        ChatTemplate(source).render([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    except TokenizerError as error:
        detail = str(error).removeprefix("chat template error: ").rpartition("; ")[0] or str(error)
        raise TokenizerError(f"{origin} does not render a one-message chat ({detail}); fix the template or pass "
                             "another file") from None


def check_messages(messages: Any) -> None:
    """Raise PromptError unless `messages` is a non-empty list of {'role': str, 'content': ...} dicts.

    `content` may be a string, a list of content blocks (multimodal) or None; it may be left out only by a message
    that carries `tool_calls` (an assistant turn that only calls tools).
    """
    if not isinstance(messages, (list, tuple)):
        raise PromptError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}; "
            "wrap the message dicts in a list"
        )
    if not messages:
        raise PromptError("messages is empty: pass at least one {'role': 'user', 'content': ...} message")
    for index, message in enumerate(messages):
        _check_message(index, message)


def _check_message(index: int, message: Any) -> None:
    """Validate one message of the conversation (see `check_messages`)."""
    if not isinstance(message, dict):
        raise PromptError(
            f"messages[{index}] is a {type(message).__name__}, not a dict: "
            "pass each message as {'role': ..., 'content': ...}"
        )
    if not isinstance(message.get("role"), str):
        raise PromptError(
            f"messages[{index}] has no 'role' string: give each message a role such as 'system', 'user' or "
            "'assistant'"
        )
    if "content" not in message and "tool_calls" not in message:
        raise PromptError(f"messages[{index}] has no 'content': add the message text under 'content'")
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list, tuple)):
        raise PromptError(
            f"messages[{index}]['content'] is a {type(content).__name__}: pass a string or a list of content blocks"
        )


def _check_dict_list(name: str, value: Any) -> None:
    """Raise TokenizerError unless `value` (tools or documents) is None or a list of dicts."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, dict) for item in value):
        raise TokenizerError(
            f"{name} must be a list of dicts (JSON schemas for tools, {{'title', 'text'}} for documents); "
            f"convert each of the {name} to a dict"
        )


class ChatTemplate:
    """One compiled chat template plus the special-token strings it may refer to.

    `special_tokens` maps names such as `bos_token` and `eos_token` to their strings (and optionally
    `additional_special_tokens` to a list); they are visible to the template as variables, as in transformers.
    """

    def __init__(self, source: str, special_tokens: dict[str, Any] | None = None) -> None:
        if not isinstance(source, str) or not source.strip():
            raise TokenizerError("chat template is empty: pass the Jinja template text")
        self.source = source
        self.special_tokens = {name: value for name, value in (special_tokens or {}).items() if value}

    def __repr__(self) -> str:
        return f"ChatTemplate({len(self.source)} chars)"

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render the conversation to prompt text.

        `tools` and `documents` (default None) and any other keyword (e.g. `enable_thinking=False` for Qwen3) are
        passed to the template; keywords override special-token variables of the same name. Raises PromptError for
        malformed messages and TokenizerError (one line) when the template fails or calls `raise_exception`.
        """
        check_messages(messages)
        tools = kwargs.pop("tools", None)
        documents = kwargs.pop("documents", None)
        _check_dict_list("tools", tools)
        _check_dict_list("documents", documents)
        variables = {**self.special_tokens, **kwargs}
        template = _compile(self.source)
        try:
            return template.render(
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.TemplateError as error:
            raise TokenizerError(f"chat template error: {_one_line(error.message or error)}; {_FIX_HINT}") from None
        except Exception as error:  # a template bug surfacing as a Python error, e.g. str + int
            raise TokenizerError(
                f"chat template error: {type(error).__name__}: {_one_line(error)}; {_FIX_HINT}"
            ) from None
