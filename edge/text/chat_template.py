"""Render Hugging Face chat templates the way transformers does.

A checkpoint's chat template is a Jinja2 program that turns a list of chat messages into the prompt text the model
was trained on. transformers 4.57 (`apply_chat_template(tokenize=False)`) renders it in an immutable sandbox with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block, a `tojson` filter that
does not escape HTML, and the globals `raise_exception` and `strftime_now`. This module sets up the same environment,
so the text edge feeds the model is byte-for-byte the text transformers would produce.

A template comes with the model file, so it is untrusted code. Every render runs in a separate worker process
(edge/text/limited_process.py: started once, reused) whose CPU time and address space are limited by the kernel,
and which is killed when it runs past the render's time limit, so work inside C-implemented filters and methods is
bounded too; the caller's signal handlers run while it waits. Inside the worker, besides Jinja's sandbox, a tracer on
the template's own frames checks the time limit at each line, the output is counted, and the operations that make
one huge value in a single step (`'x' * 10**10`, `10**10**10`, `'%9999999999d' % 1`, `center(10**10)`, `join` and
`replace` that multiply a string) are refused. Going past a limit is a `TemplateLimitError`; a template the sandbox
stops, or one that uses a name nobody defines, is a `TemplateFaultError`: both blame the template, not the messages.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from datetime import datetime
from functools import lru_cache, wraps
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
import jinja2.sandbox

from edge.errors import PromptError, TokenizerError
from edge.text import limited_process

_FIX_HINT = "fix the messages to fit the template, or pass another chat template"
_TEMPLATE_FIX = ("the chat template is at fault, not the messages: fix it in the model's files (chat_template.jinja, "
                 "tokenizer_config.json or the GGUF's tokenizer.chat_template) or pass another one "
                 "(--chat-template FILE)")

RENDER_SECONDS = 5.0  # one render's time limit; chat templates take milliseconds
RENDER_CHARS = 2**20  # the least text (and largest single value) a render may make; 4x the input's size if larger
RANGE_ITEMS = 100_000  # items a range() may have (Jinja's sandbox limit)
RENDER_MEMORY = 512 * 2**20  # memory a render may take besides its inputs (the worker's address space grows by at
# most this plus 16 bytes per character of the output limit)


class TemplateFaultError(TokenizerError):
    """A chat template failed in a way that is its own fault (the model file's, or the one passed), never the
    messages': a syntax error, an operation the sandbox forbids, a name nobody defines, a limit."""


class TemplateLimitError(TemplateFaultError):
    """A chat template ran past its time or memory limit or made too much text."""


class _Limits:
    """One render's limits, for the thread rendering: a deadline and a size for the output and for any one value."""

    def __init__(self, seconds: float, chars: int) -> None:
        self.seconds, self.chars = seconds, chars
        self.deadline = time.monotonic() + seconds

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"chat template error: rendering ran past its {self.seconds:g} s limit (a loop "
                                     f"that does not end?); {_TEMPLATE_FIX}")

    def check_size(self, size: int, what: str) -> None:
        if size > self.chars:
            raise TemplateLimitError(f"chat template error: {what} of {size:,} characters is over the {self.chars:,} "
                                     f"a render may make; {_TEMPLATE_FIX}")


_active = threading.local()  # .limits: the render this thread is in, if any


def _limits() -> _Limits:
    """The running render's limits; outside a render (Jinja folding constants at compile time) the defaults."""
    return getattr(_active, "limits", None) or _Limits(RENDER_SECONDS, RENDER_CHARS)


def _sized(value: Any) -> Any:
    """`value`, unless it is a string or sequence over the render's size limit."""
    if isinstance(value, (str, list, tuple)):
        _limits().check_size(len(value), "a value")
    return value


_FORMAT_NUMBER = re.compile(r"\d+")


def _check_format(pattern: str) -> None:
    """A format string (`%`-style or str.format) must not ask for a width or precision over the size limit."""
    limits = _limits()
    for number in _FORMAT_NUMBER.findall(pattern):
        if len(number) > 12 or int(number) > limits.chars:
            limits.check_size(int(number[:13]), "a format width")


def _check_repeat(items: Any, times: Any) -> None:
    """`items * times` for a string or sequence: refused when the result would be over the size limit."""
    if isinstance(items, (str, list, tuple)) and isinstance(times, int):
        _limits().check_size(len(items) * max(times, 0), "a repeated value")


def _check_join(separator: Any, items: Any) -> None:
    if isinstance(separator, str) and hasattr(items, "__len__"):
        _limits().check_size(len(separator) * max(len(items) - 1, 0), "a join")


def _check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        matches = text.count(old) if old else len(text) + 1
        _limits().check_size(len(text) + matches * len(new), "a replace")


def _check_call(function: Any, args: tuple, kwargs: dict) -> None:
    """Before a call from the template: the arguments that make a string larger than the limit are refused (widths
    of center/ljust/..., a join or replace that multiplies a string, format widths); so are oversized arguments."""
    target = getattr(function, "__wrapped__", function)
    owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    values = (*args, *kwargs.values())
    for value in values:
        _sized(value)
    if not isinstance(owner, str):
        return
    if name in ("center", "ljust", "rjust", "zfill", "expandtabs"):
        for value in values:
            if isinstance(value, int):
                _limits().check_size(value * (owner.count("\t") if name == "expandtabs" else 1), "a padded string")
    elif name == "join" and args:
        _check_join(owner, args[0])
    elif name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1])
    elif name in ("format", "format_map"):
        _check_format(owner)


def _checked_filter(name: str, function: Any) -> Any:
    """A filter that refuses arguments making a string over the size limit, and results over it."""

    @wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        values = [value for value in (*args, *kwargs.values()) if not isinstance(value, jinja2.nodes.EvalContext)]
        for value in values:
            _sized(value)
            if isinstance(value, int) and not isinstance(value, bool) and name != "round":
                _limits().check_size(value, f"a '{name}' filter argument")
        if name == "join" and len(values) >= 2:
            _check_join(values[1], values[0] if hasattr(values[0], "__len__") else [])
        elif name == "replace" and len(values) >= 3:
            _check_replace(values[0], values[1], values[2])
        elif name == "format" and values:
            _check_format(str(values[0]))
        elif name == "wordwrap" and values and isinstance(values[0], str):
            wrap = kwargs.get("wrapstring") or (args[3] if len(args) > 3 and isinstance(args[3], str) else "\n")
            width = next((value for value in values[1:2] if isinstance(value, int)), 79)
            _limits().check_size(len(values[0]) + len(values[0]) // max(width, 1) * len(wrap), "a wordwrap")
        return _sized(function(*args, **kwargs))

    return checked


class _LimitedNamespace(jinja2.runtime.Namespace):
    """`namespace()`, whose attributes cannot hold a value over the size limit (a loop doubling a string)."""

    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, _sized(value))


class _BoundedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with each call checked against the running render's limits and the operators that
    make a huge value in one step (`*`, `**`, `%`) refused past them (intercepted operators are not folded at compile
    time either)."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            _limits().check_size(right * abs(left).bit_length() // 3, "a power")  # about its decimal digits
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's own
        _limits().check_time()
        if __obj is range:
            __obj = _bounded_range
        _check_call(__obj, args, kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs))


def _bounded_range(*args: int) -> range:
    items = range(*args)
    if len(items) > RANGE_ITEMS:
        raise TemplateLimitError(f"chat template error: range() of {len(items):,} items is over the {RANGE_ITEMS:,} "
                                 f"a render may loop over; {_TEMPLATE_FIX}")
    return items


def _tracer(limits: _Limits) -> Any:
    """A trace function (sys.settrace, this thread only) that checks the deadline on each line the template's own
    compiled code runs, so that loops without calls (`range(n)|list` nested) stop too."""

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        limits.check_time()
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == "<template>":
            limits.check_time()
            return on_line
        return None

    return on_call


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
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _checked_filter(name, function) for name, function in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _LimitedNamespace
    env.globals["range"] = _bounded_range
    return env


def _one_line(text: str) -> str:
    """Collapse whitespace so an error message stays on one line."""
    return " ".join(str(text).split())


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    """Compile a template once (in the worker process); later renders of the same source reuse it."""
    return _environment().from_string(source)


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
    one-message chat (in the worker process, within the render's limits)."""
    if not isinstance(source, str) or not source.strip():
        raise TokenizerError(f"{origin} is empty; pass a Jinja chat template")
    reply = _render_isolated(source, {"messages": [{"role": "user", "content": "Hello"}], "tools": None,
                                      "documents": None, "add_generation_prompt": True}, RENDER_CHARS)
    if "text" in reply:
        return
    if reply["kind"] == "syntax":
        where = f", line {reply['line']}" if reply.get("line") is not None else ""
        raise TemplateFaultError(f"{origin}{where}: {reply['detail']}; fix the template") from None
    if reply["kind"] == "limit":
        raise TemplateLimitError(f"{origin}: chat template error: {reply['detail']}; {_TEMPLATE_FIX}")
    raise TemplateFaultError(f"{origin} does not render a one-message chat ({reply['detail']}); fix the template or "
                             "pass another file")


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
        inputs = {"messages": messages, "tools": tools, "documents": documents, **kwargs}
        chars = max(RENDER_CHARS, 4 * len(json.dumps(inputs, default=str)))
        variables = {**self.special_tokens, **kwargs, "messages": messages, "tools": tools, "documents": documents,
                     "add_generation_prompt": add_generation_prompt}
        reply = _render_isolated(self.source, variables, chars)
        if "text" in reply:
            return reply["text"]
        kind, detail = reply["kind"], reply["detail"]
        if kind == "syntax":
            where = f"line {reply['line']}: " if reply.get("line") is not None else ""
            raise TemplateFaultError(f"chat template error: {where}{detail}; fix the template "
                                     "(chat_template.jinja or tokenizer_config.json) or pass another chat template")
        if kind == "limit":
            raise TemplateLimitError(f"chat template error: {detail}; {_TEMPLATE_FIX}")
        if kind == "template":
            raise TemplateFaultError(f"chat template error: {detail}; {_TEMPLATE_FIX}")
        raise TokenizerError(f"chat template error: {detail}; {_FIX_HINT}")


def _render_isolated(source: str, variables: dict[str, Any], chars: int) -> dict[str, Any]:
    """`render_request` in the worker process, within RENDER_SECONDS, `chars` of output and RENDER_MEMORY: its
    reply, with a limit the worker was stopped at (time, memory) as a "limit" reply."""
    request = {"source": source, "variables": variables, "seconds": RENDER_SECONDS, "chars": chars}
    try:
        return limited_process.call("edge.text.chat_template:render_request", request, seconds=RENDER_SECONDS,
                                    memory=RENDER_MEMORY + 16 * chars)
    except limited_process.LimitExceeded as stopped:
        return {"kind": "limit", "detail": f"rendering {stopped.detail}"}
    except limited_process.RequestError as error:
        raise TokenizerError(f"the chat holds a value the chat template cannot be given ({error}); pass the messages "
                             "and template keywords as plain data: text, numbers, lists and dicts") from None
    except limited_process.WorkerError as error:
        raise TokenizerError(f"cannot render the chat template: {error}; check that this Python can start "
                             "another copy of itself") from None


def render_request(request: dict[str, Any]) -> dict[str, Any]:
    """In the worker process: compile and render one template. {"text": ...}, or {"kind", "detail", "line"} naming
    what failed: "syntax", "limit" (time, size, depth), "template" (the sandbox refused an operation, or a name is
    undefined: the template's fault) or "messages" (the template refused the chat, or failed on it)."""
    limits = _Limits(request["seconds"], request["chars"])
    try:
        template = _compile(request["source"])
    except jinja2.TemplateSyntaxError as error:
        return {"kind": "syntax", "detail": _one_line(error.message or error), "line": error.lineno}
    except RecursionError:
        return {"kind": "limit", "detail": "the template is nested too deep to compile"}
    except Exception as error:  # noqa: BLE001 - Jinja's compiler failing past its own checks ({% break %} outside a
        # loop: Python's SyntaxError; a list as a dict key: TypeError): still the template's syntax, not the chat's
        return {"kind": "syntax", "detail": f"{type(error).__name__}: {_one_line(error)}", "line": None}
    try:
        return {"text": _limited_render(template, limits, **request["variables"])}
    except TemplateLimitError as error:
        return {"kind": "limit", "detail": str(error).removeprefix("chat template error: ").partition(
            f"; {_TEMPLATE_FIX}")[0]}
    except RecursionError:
        return {"kind": "limit", "detail": "rendering recursed too deep"}
    except jinja2.exceptions.SecurityError as error:
        return {"kind": "template", "detail": f"the sandbox refused an operation ({_one_line(error).rstrip('.')})"}
    except jinja2.exceptions.UndefinedError as error:
        message = _one_line(error.message or error)
        if message.endswith("is undefined"):
            return {"kind": "template", "detail": f"{message}: the template uses a name nothing defines"}
        return {"kind": "messages", "detail": message}
    except jinja2.TemplateError as error:  # raise_exception() refusing the chat, among others
        return {"kind": "messages", "detail": _one_line(error.message or error)}
    except MemoryError:
        raise  # the worker reports it, and ends
    except Exception as error:  # noqa: BLE001 - a template bug surfacing as a Python error, e.g. str + int
        return {"kind": "messages", "detail": f"{type(error).__name__}: {_one_line(error)}"}


def _limited_render(template: jinja2.Template, limits: _Limits, **variables: Any) -> str:
    """`template.render(**variables)` within `limits`: the deadline checked at each line of the template's code (a
    tracer on this thread, the previous one put back after), the output counted as it is made."""
    parts, size = [], 0
    previous_limits, previous_trace = getattr(_active, "limits", None), sys.gettrace()
    _active.limits = limits
    sys.settrace(_tracer(limits))
    try:
        for part in template.generate(**variables):
            size += len(part)
            limits.check_size(size, "an output")
            parts.append(part)
    finally:
        sys.settrace(previous_trace)
        _active.limits = previous_limits
    return "".join(parts)
