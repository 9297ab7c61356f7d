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
from tests.helpers import sigint_as_from_a_terminal
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


# Work inside C code (a repr, a list concatenation) escapes every Python-level check: the worker process's limits
# (its CPU time, its address space, the caller's kill at the deadline) bound it.
NESTED_DOUBLING = ("{% set ns = namespace(l=['x']) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"
                   "{{ ns.l|string|length }}")
GROWING_LIST = ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + ['a' * (1000000 - i % 2)]"
                " %}{% endfor %}{{ ns.l|length }}")


def test_work_inside_c_code_is_stopped_at_the_time_limit(short_limit):
    started = time.monotonic()
    with pytest.raises(TemplateLimitError) as raised:
        ChatTemplate(NESTED_DOUBLING).render(HI)
    assert time.monotonic() - started < 10  # 0.3 s and a second's grace, generously
    assert "rendering ran past its 0.3 s limit" in str(raised.value)
    assert_blames_the_template(raised.value)
    assert ChatTemplate("{{ messages[0]['content'] }}").render(HI) == "Hi"  # a fresh worker renders the next one


def test_a_templates_total_memory_is_bounded_not_each_value(monkeypatch):
    monkeypatch.setattr(chat_template, "RENDER_MEMORY", 64 * 2**20)
    with pytest.raises(TemplateLimitError) as raised:
        ChatTemplate(GROWING_LIST).render(HI)  # each value 1 MB, under the value limit; 100 GB in all
    assert "rendering ran out of its 80 MiB of memory" in str(raised.value)  # 64 MiB and 16 bytes per output char
    assert_blames_the_template(raised.value)


def test_the_check_at_load_runs_under_the_same_limits(short_limit, tmp_path):
    path = tmp_path / "hostile.jinja"
    path.write_text(NESTED_DOUBLING)
    started = time.monotonic()
    with pytest.raises(TemplateLimitError) as raised:
        chat_template.read_template_file(path)
    assert time.monotonic() - started < 10
    assert str(raised.value).startswith(f"chat template file {path}: chat template error: rendering ran past")
    assert_blames_the_template(str(raised.value).partition(": ")[2])


def test_renders_reuse_one_worker_process():
    from edge.text import limited_process

    template = ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    template.render(HI)
    workers = {worker.process.pid for worker in limited_process._pool._idle}
    for _ in range(20):
        assert template.render(HI) == "Hi"
    assert {worker.process.pid for worker in limited_process._pool._idle} == workers


@pytest.mark.parametrize("source, detail", [
    ("{{ messages.append(1) }}", "the sandbox refused an operation (access to attribute 'append' of 'list' object is "
                                 "unsafe)"),
    ("{{ ''.__class__.__mro__ }}", "the sandbox refused an operation"),
    ("{{ undefined_helper.format(messages) }}", "'undefined_helper' is undefined: the template uses a name nothing "
                                                "defines"),
])
def test_a_template_the_sandbox_stops_or_that_uses_an_undefined_name_is_blamed(source, detail):
    from edge.text.chat_template import TemplateFaultError

    with pytest.raises(TemplateFaultError) as raised:
        ChatTemplate(source).render(HI)
    assert str(raised.value).startswith(f"chat template error: {detail}")
    assert_blames_the_template(raised.value)


def test_a_template_refusing_the_chat_still_asks_to_fix_the_messages():
    with pytest.raises(chat_template.TokenizerError) as raised:
        ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}").render(HI)
    assert not isinstance(raised.value, chat_template.TemplateFaultError)
    assert str(raised.value) == ("chat template error: Conversation roles must alternate; fix the messages to fit the "
                                 "template, or pass another chat template")


RENDER_UNTIL_SIGNALLED = """
import resource, signal, sys
resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))  # the old in-process render grew without bound
from edge.text import chat_template
chat_template.RENDER_SECONDS = 60.0
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))  # a Python handler, as edge-serve's uvicorn has
print("rendering", flush=True)
try:
    chat_template.ChatTemplate(sys.argv[1]).render([{"role": "user", "content": "Hi"}])
except KeyboardInterrupt:
    sys.exit(4)
"""


@pytest.mark.parametrize("signum, status", [("SIGTERM", 3), ("SIGINT", 4)])
def test_a_signal_during_a_render_is_handled_at_once(tmp_path, signum, status):
    import os
    import signal
    import subprocess
    import sys

    import psutil

    script = tmp_path / "render.py"
    script.write_text(RENDER_UNTIL_SIGNALLED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, str(script), NESTED_DOUBLING], stdout=subprocess.PIPE, env=env,
                               preexec_fn=sigint_as_from_a_terminal)
    try:
        assert process.stdout.readline() == b"rendering\n"
        deadline = time.monotonic() + 30
        busy = []
        while not busy and time.monotonic() < deadline:  # until the worker has spent some CPU time on the render
            busy = [child for child in psutil.Process(process.pid).children() if child.cpu_times().user > 0.8]
            time.sleep(0.02)
        assert busy, "no worker process rendered the template"
        process.send_signal(getattr(signal, signum))
        assert process.wait(5) == status  # handled while the render runs, not after its 60 s limit
        assert not busy[0].is_running() or busy[0].status() == psutil.STATUS_ZOMBIE  # its worker ended with it
    finally:
        process.kill()
        process.wait()


def test_a_value_that_cannot_reach_the_worker_is_one_line_naming_the_fix():
    import threading

    with pytest.raises(chat_template.TokenizerError) as raised:
        ChatTemplate("{{ lock }}").render(HI, lock=threading.Lock())
    assert str(raised.value).startswith("the chat holds a value the chat template cannot be given (TypeError: ")
    assert str(raised.value).endswith("pass the messages and template keywords as plain data: text, numbers, lists "
                                      "and dicts")
    assert ChatTemplate("{{ messages[0]['content'] }}").render(HI) == "Hi"
