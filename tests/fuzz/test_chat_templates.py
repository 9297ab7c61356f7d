"""Fuzzed chat templates (tests/fuzz/jinja_templates.py) through the public rendering entry point,
ChatTemplate(source).render(messages): each renders, or is refused in edge's one-line error, within its time
limit. Renders run in a worker process of this test, killed past the limit (C code inside a filter can hold a
thread for ever) and given an address-space cap (what a render may allocate)."""

from __future__ import annotations

import multiprocessing
import resource
import traceback

import pytest
from hypothesis import event
from hypothesis import strategies as st

from edge.text import chat_template
from tests.fuzz import harness
from tests.fuzz.jinja_templates import templates

RENDER_S = getattr(chat_template, "RENDER_SECONDS", 5.0)
LIMIT_S = 2 * RENDER_S + 3  # the render's own limit, and room for its start
WORKER_MEMORY = 2 * 2**30  # the address space a render may add
CHATS = [[{"role": "user", "content": "Hello"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "<|im_end|>{{ x }}"}]]


def _serve(connection) -> None:
    """The worker: render each (source, messages) received, answer ("text" | "refused" | "crashed", detail)."""
    import psutil

    from edge.errors import EdgeError
    from edge.text.chat_template import ChatTemplate

    limit = psutil.Process().memory_info().vms + WORKER_MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    while True:
        source, messages = connection.recv()
        try:
            connection.send(("text", str(len(ChatTemplate(source).render(messages)))))
        except EdgeError as error:
            connection.send(("refused", f"{type(error).__name__}: {error}"))
        except BaseException:  # noqa: BLE001 - what the render let through is the finding
            connection.send(("crashed", traceback.format_exc()))


class RenderWorker:
    """A process rendering templates for this test (spawned: nothing of this process's threads comes with it),
    killed and started afresh when a render runs past the limit or the process dies."""

    def __init__(self) -> None:
        self.process = None

    def render(self, source: str, messages: list[dict], seconds: float) -> tuple[str, str]:
        if self.process is None or not self.process.is_alive():
            self._start()
        self.connection.send((source, messages))
        if self.connection.poll(seconds):
            try:
                return self.connection.recv()
            except EOFError:
                pass
        self.process.join(0.5)
        code = self.process.exitcode
        self.stop()
        return ("hung", f"no answer within {seconds:g} s") if code is None else ("died", f"exit code {code}")

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True, name="template-render")
        self.process.start()
        child.close()
        self.connection.send(("{{ 1 }}", CHATS[0]))  # the first answer waits for the imports, not the limit
        assert self.connection.poll(120) and self.connection.recv()[0] == "text"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.process = None


@pytest.fixture(scope="module")
def worker():
    worker = RenderWorker()
    yield worker
    worker.stop()


def test_a_fuzzed_chat_template_renders_or_is_refused_in_one_line(worker):
    def one_template(source, messages):
        with harness.limited(LIMIT_S + 5, source):
            outcome, detail = worker.render(source, messages, LIMIT_S)
        event(outcome)
        assert outcome in ("text", "refused"), f"{outcome}: {detail}"
        assert "\n" not in detail, detail

    harness.run(one_template, source=templates, messages=st.sampled_from(CHATS))
