"""A chat template is code from a model file: every render has a time limit and a size limit, and the operations
that make one huge value at once are refused. Going past one is a one-line TemplateLimitError that blames the
template (the model file's, or the one passed), never the messages, in the library, edge-chat and edge-serve."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from edge import Engine
from edge.text import chat_template
from edge.sources.builtin import builtin_model_path
from edge.text.chat_template import ChatTemplate, TemplateLimitError
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer
from edge.tui.cli import main as chat_main

HI = [{"role": "user", "content": "Hi"}]
ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.3)


def assert_blames_the_template(error: BaseException) -> None:
    message = str(error)
    assert "\n" not in message and "the chat template is at fault, not the messages" in message
    assert "--chat-template FILE" in message and "fix the messages" not in message


@pytest.mark.slow
@pytest.mark.parametrize("source", [
    ENDLESS,  # nested loops over ranges: stopped at a call
    "{% set r = range(100000)|list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",  # no call in the loop
])
def test_a_template_that_runs_on_is_stopped_at_its_time_limit(short_limit, source):
    started = time.monotonic()
    with pytest.raises(TemplateLimitError) as raised:
        ChatTemplate(source).render(HI)
    assert time.monotonic() - started < 10  # 0.3 s, generously
    assert_blames_the_template(raised.value)


@pytest.mark.parametrize("source", [
    "{{ 'x' * 10**10 }}",
    "{{ [1] * 10**10 }}",
    "{{ 2 ** (10 ** 10) }}",
    "{{ '%9999999999d' % 1 }}",
    "{{ '%9999999999d'|format(1) }}",
    "{{ 'x'|center(10**10) }}",
    "{{ 'x'.ljust(10**10) }}",
    "{{ '{:>9999999999}'.format(1) }}",
    "{{ range(100000)|join('x' * 100000) }}",
    "{{ ('x' * 100000).replace('', 'y' * 1000) }}",
    "{{ range(10)|batch(10**9, 'x')|list }}",
    "{{ range(10**10)|list }}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% macro f(s, n) %}{{ f(s ~ s, n - 1) if n else s|length }}{% endmacro %}{{ f('x', 64) }}",
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",  # 100 MB of output, 1 KB at a time
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",  # recursion
])
def test_a_template_that_makes_a_huge_value_is_refused_before_making_it(source):
    started = time.monotonic()
    with pytest.raises(TemplateLimitError) as raised:
        ChatTemplate(source).render(HI)
    assert time.monotonic() - started < 10
    assert_blames_the_template(raised.value)


def test_large_messages_still_render_in_full():
    content = "word " * 400_000  # 2 MB: the output limit grows with the input
    text = ChatTemplate("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}").render(
        [{"role": "user", "content": content}])
    assert text == "<user>" + content


def test_a_limited_render_leaves_the_thread_as_it_found_it(short_limit):
    import sys

    before = sys.gettrace()
    with pytest.raises(TemplateLimitError):
        ChatTemplate(ENDLESS).render(HI)
    assert sys.gettrace() is before
    assert ChatTemplate("{{ messages[0]['content'] }}").render(HI) == "Hi"


@pytest.fixture(scope="module")
def endless_model(tmp_path_factory, llama_dir):
    folder = tmp_path_factory.mktemp("endless") / "model"
    shutil.copytree(llama_dir, folder)
    (folder / "chat_template.jinja").write_text(ENDLESS)
    return folder


def test_edge_chat_blames_the_models_template(endless_model, short_limit, capsys):
    assert chat_main([str(endless_model), "--prompt", "Hello", "--max-new-tokens", "4", "--no-baseline"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("edge-chat: error: chat template error: rendering ran past its 0.3 s limit")
    assert_blames_the_template(error.strip())


@pytest.mark.slow
def test_edge_serve_blames_the_models_template_and_goes_on(short_limit):
    engine = Engine.load(builtin_model_path())
    engine.tokenizer.set_chat_template("{{ 'x' * 10**10 }}")
    with BackgroundServer(lambda: engine, ServeConfig("bad-template")) as running:
        running.generations.loaded.wait(60)
        reply = httpx.post(running.url + "/v1/chat/completions", json={"messages": HI}, timeout=30)
        assert reply.status_code == 500, reply.text
        error = reply.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "chat_template_error"
        assert_blames_the_template(error["message"])
        engine.tokenizer.set_chat_template(ENDLESS)
        reply = httpx.post(running.url + "/v1/chat/completions", json={"messages": HI}, timeout=30)
        assert reply.status_code == 500 and "0.3 s limit" in reply.json()["error"]["message"]
        text = httpx.post(running.url + "/v1/completions", json={"prompt": "The json", "max_tokens": 2}, timeout=30)
        assert text.status_code == 200  # the server goes on
