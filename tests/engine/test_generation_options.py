"""The generation options declared once: every field of SamplingParams (edge/decoding/sampling.py) is taken and refused
at the same values by each front that derives from it, the library (SamplingParams, GenerationOptions), edge-chat's
and edge-serve's flags, the chat app's settings and its form, and edge-serve's request schema; and no front adds or
drops a shared option of its own."""

from __future__ import annotations

import dataclasses
import math

import pytest
from pydantic import ValidationError

from edge.decoding.sampling import DEFAULTS, OPTIONS, Limits, SamplingParams, label
from edge.engine import GenerationOptions
from edge.errors import SamplingError
from edge.frontend.options import flag, generation_options
from edge.serve.cli import build_parser as serve_parser
from edge.serve.schemas import REQUEST_NAMES, ChatCompletionRequest, CompletionRequest, SamplingRequest
from edge.tui.cli import build_parser as chat_parser
from edge.tui.settings import CHAT_MAX_NEW_TOKENS, FORM_OPTIONS, ChatSettings, form_text, form_value

ENGINE_OWN = {"ignore_eos", "speculate", "task", "should_stop", "response_format"}  # the library's alone
PARSERS = {"edge-chat": chat_parser, "edge-serve": serve_parser}


def edges(limits: Limits) -> list[tuple[object, bool]]:
    """(value, taken) at and just past each limit of one option."""
    if limits.kind is str:
        return [(("x",) * limits.most, True), (("x",) * (limits.most + 1), False), (("",), False), (("a", "b"), True)]
    below = (lambda x: x - 1) if limits.kind is int else (lambda x: math.nextafter(x, -math.inf))
    above = (lambda x: x + 1) if limits.kind is int else (lambda x: math.nextafter(x, math.inf))
    cases = [(None, True)] if limits.optional else []  # (a request's null is the server's default for any option)
    if limits.low is not None:
        cases += [(limits.low, False), (above(limits.low), True)] if limits.above_low else \
                 [(limits.low, True), (below(limits.low), False)]
    if limits.high is not None:
        cases += [(limits.high, True), (above(limits.high), False)]
    return [(None if value is None else limits.kind(value), taken) for value, taken in cases]


CASES = [pytest.param(name, value, taken, id=f"{name}={value!r}:{'taken' if taken else 'refused'}")
         for name, limits in OPTIONS.items() for value, taken in edges(limits)]


def refused(make, error: type[Exception]) -> str | None:
    """The error's message if `make()` refuses, else None."""
    try:
        make()
    except error as raised:
        return str(raised)
    return None


@pytest.mark.parametrize("name, value, taken", CASES)
def test_the_library_takes_and_refuses_at_the_limits(name, value, taken):
    for record in (SamplingParams, GenerationOptions):
        message = refused(lambda: record(**{name: value}), SamplingError)
        assert (message is None) == taken, (record.__name__, message)
        if message is not None:  # one line naming the field, its limits and the value
            assert message.startswith(f"{name} must be") and OPTIONS[name].bounds() in message
            assert repr(value) in message and "\n" not in message


def argv(name: str, value: object) -> list[str]:
    if value is None:
        return []  # the flag left out: its default, none
    if isinstance(value, tuple):
        return [part for text in value for part in (flag(name), text)]
    return [f"{flag(name)}={value!r}"]  # with "=": argparse reads -5e-324 as a flag otherwise


@pytest.mark.parametrize("command", PARSERS)
@pytest.mark.parametrize("name, value, taken", CASES)
def test_the_command_lines_take_and_refuse_the_same(command, name, value, taken):
    args = PARSERS[command]().parse_args(argv(name, value))
    message = refused(lambda: generation_options(args), SamplingError)
    assert (message is None) == taken, message
    if message is not None:
        assert message.startswith(f"{flag(name)} must be") and "\n" not in message
    else:
        assert getattr(generation_options(args), name) == value


@pytest.mark.parametrize("name, value, taken", CASES)
def test_the_chat_settings_and_their_form_take_and_refuse_the_same(name, value, taken):
    message = refused(lambda: ChatSettings().replace(**{name: value}), SamplingError)
    assert (message is None) == taken, message
    if name in FORM_OPTIONS:
        text = form_text(value)  # as the form shows it: read back, it is the same value
        message = refused(lambda: form_value(name, text), SamplingError)
        assert (message is None) == taken, message
        if message is not None:
            assert message.startswith(f"{label(name)} must be") and "\n" not in message
        else:
            assert form_value(name, text) == value


@pytest.mark.parametrize("name, value, taken", CASES)
def test_the_server_schema_takes_and_refuses_the_same(name, value, taken):
    field = REQUEST_NAMES.get(name, name)
    body = {field: list(value) if isinstance(value, tuple) else value}
    try:
        request = SamplingRequest.model_validate(body)
    except ValidationError as error:
        assert not taken, error
        assert [problem["loc"] for problem in error.errors()] == [(field,)]
        return
    assert taken, f"{body} was taken"
    options = request.generation_options(GenerationOptions())
    assert getattr(options, name) == (DEFAULTS[name] if value is None else value)  # null: the server's default


def test_every_front_has_the_records_fields_and_no_other_shared_one():
    names = set(OPTIONS)
    library = {field.name for field in dataclasses.fields(GenerationOptions)}
    assert library - names == ENGINE_OWN and names <= library
    for command, parser in PARSERS.items():
        dests = {action.dest for action in parser()._actions}
        assert dests & library == names, command
    settings = {field.name for field in dataclasses.fields(ChatSettings)}
    assert not settings & library and type(ChatSettings().options) is SamplingParams
    assert set(FORM_OPTIONS) == {name for name, limits in OPTIONS.items() if limits.kind is not str}
    served = {request: {REQUEST_NAMES.get(name, name) for name in library} & set(request.model_fields)
              for request in (SamplingRequest, CompletionRequest, ChatCompletionRequest)}
    shared = {REQUEST_NAMES.get(name, name) for name in names}
    assert served[SamplingRequest] == served[CompletionRequest] == shared | {"ignore_eos"}
    assert served[ChatCompletionRequest] == shared | {"ignore_eos", "response_format"}


def test_the_defaults_are_the_records():
    assert GenerationOptions().options() == SamplingParams().options() == DEFAULTS
    commands = {**DEFAULTS, "max_new_tokens": CHAT_MAX_NEW_TOKENS}  # the chat commands' longer replies
    for parser in PARSERS.values():
        args = parser().parse_args([])
        assert {name: getattr(args, name) for name in OPTIONS} == {**dict.fromkeys(OPTIONS), "stop": []}  # not given
        assert generation_options(args).options() == commands
        recommended = {"temperature": 0.7, "top_k": 20, "repetition_penalty": 1.05}  # a model's generation_config
        assert generation_options(args, recommended).options() == {**commands, **recommended}
        asked = parser().parse_args(["--temperature", "0", "--top-k", "5"])  # flags over the model's: greedy asked
        assert generation_options(asked, recommended).options() == {**commands, "temperature": 0.0, "top_k": 5}
    assert ChatSettings().options.options() == {**DEFAULTS, "max_new_tokens": CHAT_MAX_NEW_TOKENS}
    assert SamplingRequest().generation_options(GenerationOptions()).options() == DEFAULTS
