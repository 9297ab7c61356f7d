"""Base checkpoints (no chat template) in every front end, --chat-template FILE, and the console chat's input.

A base model runs as a completion model: `--prompt` continues the text, `--plain` and the app keep one running
text that each message continues; each says so once. A template file given with --chat-template (or
Engine.load(..., chat_template=FILE)) makes it a chat model."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from edge.engine import Engine
from edge.errors import PromptError, TokenizerError
from tests.conftest import CHATML_TEMPLATE
from tests.helpers import greedy_text
from edge.tui.app import EdgeChatApp
from edge.tui.cli import main as chat_main
from edge.tui.completion import running_text
from edge.tui.history import ConversationStore
from edge.tui.loader import SessionLoader
from edge.tui.settings import ChatSettings
from edge.tui.widgets.prompt import PromptInput

TOKENS = 12


@pytest.fixture
def template_file(tmp_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML_TEMPLATE, encoding="utf-8")
    return path


@pytest.fixture
def piped(monkeypatch):
    def pipe(text: str) -> None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8", "surrogateescape"))))
    return pipe


def test_prompt_on_a_base_model_continues_the_text_and_says_so_once(base_dir, capsys):
    assert chat_main([str(base_dir), "--prompt", "Once upon a time", "--max-new-tokens", str(TOKENS), "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    expected = greedy_text(Engine.load(base_dir), "Once upon a time", TOKENS, ignore_eos=False)
    assert captured.out == expected + "\n"
    assert captured.err.count("completion model") == 1 and "--chat-template FILE" in captured.err


def test_piped_plain_reads_one_message_per_line_honours_quit_and_saves(base_dir, piped, capsys, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("EDGE_DATA_DIR", str(tmp_path))
    piped("The fox\nThe dog\n/quit\nnever sent\n")
    assert chat_main([str(base_dir), "--plain", "--max-new-tokens", str(TOKENS), "--temperature", "0"]) == 0
    saved = list((tmp_path / "chats").glob("*.json"))
    assert len(saved) == 1
    messages = json.loads(saved[0].read_text())["messages"]
    assert [(m["role"], m["content"]) for m in messages[::2]] == [("user", "The fox"), ("user", "The dog")]
    engine = Engine.load(base_dir)  # each message continues the running text, replies included
    first = greedy_text(engine, "The fox", TOKENS, ignore_eos=False)
    second = greedy_text(engine, running_text([*messages[:3]]), TOKENS, ignore_eos=False)
    assert [messages[1]["content"], messages[3]["content"]] == [first, second]
    assert capsys.readouterr().out == f"{first}\n{second}\n"


def test_piped_plain_on_a_chat_model_is_a_conversation(llama_dir, piped, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_DATA_DIR", str(tmp_path))
    piped("hello\n/reset\nhello again\n")
    assert chat_main([str(llama_dir), "--plain", "--max-new-tokens", str(TOKENS), "--temperature", "0"]) == 0
    chats = sorted((tmp_path / "chats").glob("*.json"))
    assert len(chats) == 2  # /reset starts a new chat
    engine = Engine.load(llama_dir)
    for path, text in zip(sorted(chats, key=lambda p: json.loads(p.read_text())["created"]), ["hello", "hello again"]):
        messages = json.loads(path.read_text())["messages"]
        assert messages[1]["content"] == greedy_text(engine, [{"role": "user", "content": text}], TOKENS,
                                                     ignore_eos=False)
    assert "completion model" not in capsys.readouterr().err


def test_an_undecodable_piped_line_is_one_line_and_the_rest_still_runs(llama_dir, piped, capsys, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("EDGE_DATA_DIR", str(tmp_path))
    piped(b"bad \xff byte\nfine\n".decode("utf-8", "surrogateescape"))
    assert chat_main([str(llama_dir), "--plain", "--max-new-tokens", "4"]) == 0
    captured = capsys.readouterr()
    assert "not valid UTF-8" in captured.err and "Traceback" not in captured.err
    messages = json.loads(next((tmp_path / "chats").glob("*.json")).read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["fine"]


def test_chat_template_file_makes_a_base_model_chat(base_dir, llama_dir, template_file, capsys):
    argv = [str(base_dir), "--chat-template", str(template_file), "--prompt", "hello", "--max-new-tokens",
            str(TOKENS), "--temperature", "0"]
    assert chat_main(argv) == 0
    captured = capsys.readouterr()
    engine = Engine.load(base_dir, chat_template=template_file)
    expected = greedy_text(engine, [{"role": "user", "content": "hello"}], TOKENS, ignore_eos=False)
    assert captured.out == expected + "\n" and "completion model" not in captured.err
    # the same weights with the template the checkpoint ships: the same reply
    assert expected == greedy_text(Engine.load(llama_dir), [{"role": "user", "content": "hello"}], TOKENS,
                                   ignore_eos=False)


@pytest.mark.parametrize("content, needle", [(None, "does not exist"), (b"\xff\xfe{{", "not UTF-8"),
                                             (b"{% if %}", "line 1"), (b"  ", "is empty"), (b"{{ messages[9].content.x() }}", "does not render")])
def test_a_bad_chat_template_file_is_one_line(base_dir, tmp_path, capsys, content, needle):
    path = tmp_path / "template.jinja"
    if content is not None:
        path.write_bytes(content)
    assert chat_main([str(base_dir), "--chat-template", str(path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err and str(path) in err
    with pytest.raises(TokenizerError, match=needle):
        Engine.load(base_dir, chat_template=path)


def test_chat_on_a_base_model_through_the_api_names_both_fixes(base_dir):
    with pytest.raises(TokenizerError) as raised:
        list(Engine.load(base_dir).chat([{"role": "user", "content": "hi"}]))
    message = str(raised.value)
    assert "generate()" in message and "--chat-template FILE" in message and "chat_template=FILE" in message


@pytest.mark.slow
def test_the_app_chats_with_a_base_model_as_a_completion_model(base_dir, tmp_path):
    async def scenario():
        settings = ChatSettings().replace(max_new_tokens=TOKENS, temperature=0.0)
        loader = SessionLoader(base_dir, settings, ConversationStore(tmp_path),
                               measure_baseline=True)
        app = EdgeChatApp(loader, memory_probe=lambda: 1)
        async with app.run_test() as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen = app.screen
            assert "completion model" in str(screen.query_one("#status").render())
            assert screen.session.baseline_tokens_per_s > 0  # measured by continuing text
            for text in ("The fox", "The dog"):
                prompt = screen.query_one(PromptInput)
                prompt.load_text(text)
                prompt.focus()
                await pilot.press("enter")
                for _ in range(4):
                    await pilot.pause()
                    await app.workers.wait_for_complete()
            return screen.session.conversation.messages
    messages = asyncio.run(scenario())
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    engine = Engine.load(base_dir)
    assert messages[1]["content"] == greedy_text(engine, "The fox", TOKENS, ignore_eos=False)
    assert messages[3]["content"] == greedy_text(engine, running_text(messages[:3]), TOKENS, ignore_eos=False)


def test_a_reply_cut_by_the_context_says_so_without_stats(llama_dir, capsys):
    # greedy and without the loop stop: a sampled reply of the random model can end at its end-of-sequence token first
    assert chat_main([str(llama_dir), "--raw", "--prompt", "hello", "--max-context", "24", "--max-new-tokens", "64",
                      "--temperature", "0", "--loop-stop", "0"]) == 0
    err = capsys.readouterr().err
    assert "the reply was cut" in err and "--max-context" in err


def test_a_prompt_over_the_models_own_limit_does_not_advise_a_longer_context(llama_dir):
    engine = Engine.load(llama_dir, max_context=4096)  # the checkpoint reads at most 512 positions
    with pytest.raises(PromptError, match="the model itself reads at most 512 tokens") as raised:
        list(engine.generate(list(range(600))))
    assert "max-context" not in str(raised.value)
    with pytest.raises(PromptError, match="--max-context 301"):
        list(Engine.load(llama_dir, max_context=300).generate(list(range(300))))


def test_running_text_puts_each_message_on_a_new_line_and_replies_right_after():
    messages = [{"role": "system", "content": "Notes."}, {"role": "user", "content": "The fox"},
                {"role": "assistant", "content": " jumps."}, {"role": "user", "content": "The dog"}]
    assert running_text(messages) == "Notes.\nThe fox jumps.\nThe dog"
