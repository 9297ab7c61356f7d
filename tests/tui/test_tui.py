"""Pilot tests of edge-chat: they drive the app with keys and assert on its state after the workers finish."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import threading
from pathlib import Path

import pytest
from rich.console import Console

from edge import activity
from edge.decoding.drafters import NGramDrafter
from edge.decoding.drafters.draft_model import DraftModelDrafter
from edge.engine import Engine
from edge.tui.app import EdgeChatApp
from edge.tui.history import Conversation, ConversationStore
from edge.tui.loader import SessionLoader
from edge.tui.screens.chat import ChatScreen
from edge.tui.screens.history import HistoryScreen
from edge.tui.screens.loading import LoadingScreen
from edge.tui.screens.settings import SettingsScreen
from edge.tui import session as session_module
from edge.tui.session import ChatSession
from edge.tui.settings import ChatSettings
from edge.tui.widgets.message import MessageView
from edge.tui.widgets.prompt import PromptInput
from edge.tui.widgets.stats import StatsPanel

RSS = 300 * 2**20  # a fixed "resident memory" so screens do not depend on the test process


@pytest.fixture(scope="session")
def tiny_model(llama_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny-model"  # a stable name: it appears on screen
    shutil.copytree(llama_dir, folder)
    return folder


@pytest.fixture
def make_app(tiny_model, tmp_path):
    def make(model: Path | None = None, **settings) -> EdgeChatApp:
        options = {"max_new_tokens": 24, "temperature": 0.0, **settings}
        loader = SessionLoader(model or tiny_model, ChatSettings().replace(**options), ConversationStore(tmp_path),
                               measure_baseline=False)
        return EdgeChatApp(loader, memory_probe=lambda: RSS)
    return make


async def ready(app: EdgeChatApp, pilot) -> ChatScreen:
    await app.workers.wait_for_complete()
    await pilot.pause()
    assert isinstance(app.screen, ChatScreen), app.load_error
    return app.screen


async def send(app: EdgeChatApp, pilot, text: str) -> None:
    prompt = app.screen.query_one(PromptInput)
    prompt.load_text(text)
    prompt.focus()
    await pilot.press("enter")
    await settle(app, pilot)


async def settle(app: EdgeChatApp, pilot) -> None:
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


def slow_down(screen: ChatScreen, after: int = 2) -> threading.Event:
    """Make the model pause after a few steps until the returned event is set: a reply that is surely mid-way."""
    gate, original = threading.Event(), screen.session.stream

    def stream(stop):
        for index, event in enumerate(original(stop)):
            yield event
            if index == after:
                gate.wait(10)
    screen.session.stream = stream
    return gate


async def start_slow_reply(screen: ChatScreen, pilot, text: str) -> threading.Event:
    """Send `text` with the model paused a few steps in; the reply streams on once the returned event is set."""
    gate = slow_down(screen)
    screen.query_one(PromptInput).load_text(text)
    await pilot.press("enter")
    return gate


def reference_reply(model: Path, messages: list[dict], max_tokens: int) -> str:
    """What a fresh engine answers to the same conversation, greedy: the app must show exactly this."""
    return "".join(event.text for event in Engine.load(model).chat(messages, max_new_tokens=max_tokens, temperature=0.0))


def test_send_streams_a_reply_renders_it_and_saves_the_chat(make_app, tiny_model, tmp_path):
    async def scenario():
        app = make_app()
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await ready(app, pilot)
            await send(app, pilot, "hello there")
            views = list(screen.query(MessageView))
            assert [v.role for v in views] == ["user", "assistant"]
            expected = reference_reply(tiny_model, [{"role": "user", "content": "hello there"}], 24)
            assert views[1].text == expected and expected
            assert screen.query_one(PromptInput).text == ""
            assert screen.query_one(StatsPanel).figures.stats.generated_tokens == 24
            saved = list((tmp_path / "chats").glob("*.json"))
            assert len(saved) == 1
            data = json.loads(saved[0].read_text())
            assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
            assert data["messages"][1]["content"] == expected and data["title"] == "hello there"
    asyncio.run(scenario())


@pytest.mark.slow
def test_stop_mid_reply_keeps_a_consistent_chat(make_app, tiny_model):
    async def scenario():
        app = make_app(max_new_tokens=400)
        async with app.run_test() as pilot:
            screen = await ready(app, pilot)
            gate = await start_slow_reply(screen, pilot, "tell me everything")
            await pilot.pause()
            await pilot.press("escape")
            gate.set()
            await settle(app, pilot)
            messages = screen.session.conversation.messages
            assert messages[-1]["finish_reason"] == "stopped"
            assert 0 < messages[-1]["stats"]["tokens"] < 400
            assert not screen.streaming and "stopped" in list(screen.query(MessageView))[-1].note
            # the next turn continues from the stopped reply exactly as a fresh engine that was not stopped
            screen.session.settings = screen.session.settings.replace(max_new_tokens=16)
            await send(app, pilot, "and then?")
            assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
            fresh = Engine.load(tiny_model)
            first = "".join(e.text for e in fresh.chat(messages[:1], temperature=0.0,
                                                       max_new_tokens=messages[1]["stats"]["tokens"]))
            assert first == messages[1]["content"]
            second = "".join(e.text for e in fresh.chat(screen.session.conversation.chat_messages()[:-1],
                                                          temperature=0.0, max_new_tokens=16))
            assert second == messages[3]["content"]
    asyncio.run(scenario())


@pytest.mark.slow
def test_a_message_sent_while_a_reply_streams_is_queued_visibly_then_sent(make_app, tiny_model):
    async def scenario():
        app = make_app(max_new_tokens=400)
        async with app.run_test() as pilot:
            screen = await ready(app, pilot)
            gate = await start_slow_reply(screen, pilot, "first")
            prompt = screen.query_one(PromptInput)
            prompt.load_text("second")
            await pilot.press("enter")  # queued: shown at once, the input is free again
            await pilot.pause()
            queued = list(screen.query(MessageView))[-1]
            assert prompt.text == "" and screen.streaming
            assert queued.role == "user" and queued.text == "second" and queued.has_class("queued")
            assert "queued" in queued.note and "1 queued" in str(screen.query_one("#status").render())
            screen.session.settings = screen.session.settings.replace(max_new_tokens=12)
            await pilot.press("ctrl+c")  # Ctrl+C stops the reply, not the app; the queued message goes next
            gate.set()
            await settle(app, pilot)
            assert app.is_running
            messages = screen.session.conversation.messages
            assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
            assert messages[0]["content"] == "first" and messages[2]["content"] == "second"
            assert not queued.has_class("queued") and queued.note == ""
            assert [v.role for v in screen.query(MessageView)] == ["user", "assistant", "user", "assistant"]
            fresh = Engine.load(tiny_model)  # the first reply as far as it got, then the queued message's
            first = "".join(e.text for e in fresh.chat(messages[:1], temperature=0.0,
                                                       max_new_tokens=messages[1]["stats"]["tokens"]))
            second = "".join(e.text for e in fresh.chat(screen.session.conversation.chat_messages()[:-1],
                                                          temperature=0.0, max_new_tokens=12))
            assert (first, second) == (messages[1]["content"], messages[3]["content"])
    asyncio.run(scenario())


@pytest.mark.slow
def test_resizing_while_a_reply_streams_keeps_it_whole(make_app, tiny_model):
    async def scenario():
        app = make_app(max_new_tokens=40)
        async with app.run_test(size=(200, 50)) as pilot:
            screen = await ready(app, pilot)
            gate = await start_slow_reply(screen, pilot, "hello there")
            await pilot.pause()
            await pilot.resize_terminal(80, 24)
            await pilot.pause()
            gate.set()
            await settle(app, pilot)
            await pilot.resize_terminal(120, 40)
            await pilot.pause()
            reply = list(screen.query(MessageView))[-1]
            expected = reference_reply(tiny_model, [{"role": "user", "content": "hello there"}], 40)
            assert reply.text == expected == screen.session.last_reply()
            assert screen.query_one(PromptInput).region.bottom <= 40 - 1  # the input stays above the footer
    asyncio.run(scenario())


@pytest.mark.slow
def test_provenance_colours_toggle_and_cover_the_reply(make_app):
    async def scenario():
        app = make_app(drafter="ngram", max_new_tokens=48)
        async with app.run_test() as pilot:
            screen = await ready(app, pilot)
            await send(app, pilot, "the cat the cat the cat the cat")
            reply = list(screen.query(MessageView))[-1]
            stats = screen.session.conversation.messages[-1]["stats"]
            assert stats["acceptance_rate"] > 0  # n-gram drafts were accepted on this repetitive prompt
            assert sum(size for size, _ in reply.runs) == len(reply.text)
            assert any(drafted for _, drafted in reply.runs) and any(not drafted for _, drafted in reply.runs)
            assert reply.query_one("Markdown").display and not reply.query_one(".provenance").display
            await pilot.press("f2")
            assert all(view.provenance for view in screen.query(MessageView))
            assert reply.query_one(".provenance").display and not reply.query_one("Markdown").display
            await pilot.press("f2")
            assert not reply.provenance
    asyncio.run(scenario())


@pytest.mark.slow
def test_settings_change_the_drafter_in_place_and_reject_bad_values(make_app):
    async def scenario():
        app = make_app()
        async with app.run_test(size=(100, 40)) as pilot:
            screen = await ready(app, pilot)
            engine = screen.session.engine
            await pilot.press("f3")
            assert isinstance(app.screen, SettingsScreen)
            app.screen.query_one("#temperature").value = "hot"
            await pilot.click("#apply")
            assert isinstance(app.screen, SettingsScreen)  # not applied
            assert "temperature must be a number" in str(app.screen.query_one("#settings-error").render())
            app.screen.query_one("#temperature").value = "0"
            app.screen.query_one("#drafter").value = "ngram"
            app.screen.query_one("#max_new_tokens").value = "12"
            await pilot.press("ctrl+s")  # the key applies too
            await pilot.pause()
            assert app.screen is screen, app.screen.query_one("#settings-error").render()
            assert screen.session.engine is engine  # applied without reloading the model
            assert isinstance(engine.drafter, NGramDrafter)
            assert screen.session.settings.options.max_new_tokens == 12
            assert screen.query_one(StatsPanel).figures.drafter == "ngram"
            await send(app, pilot, "hello")
            assert screen.session.conversation.messages[-1]["stats"]["tokens"] == 12
    asyncio.run(scenario())


@pytest.mark.slow
def test_a_draft_model_named_in_the_settings_drafts_for_the_chat(make_app, tiny_model, tmp_path):
    """A draft model as the command line names one: here a .gguf file of the same model family."""
    from tests.gguf_files import write_gguf

    draft = write_gguf(tiny_model, tmp_path / "draft.Q8_0.gguf", {"default": "q8_0"})

    async def scenario():
        app = make_app()
        async with app.run_test(size=(100, 40)) as pilot:
            screen = await ready(app, pilot)
            await pilot.press("f3")
            app.screen.query_one("#draft_model").value = str(draft)
            await pilot.press("ctrl+s")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.screen is screen, app.screen.query_one("#settings-error").render()
            assert isinstance(screen.session.engine.drafter, DraftModelDrafter)
            assert screen.session.drafter_spec == f"draft:{draft}"
            await send(app, pilot, "hello")
            assert screen.session.conversation.messages[-1]["stats"]["tokens"] > 0
    asyncio.run(scenario())


@pytest.mark.slow
def test_a_budget_too_small_is_reported_and_not_applied(make_app):
    async def scenario():
        app = make_app()
        async with app.run_test(size=(100, 40)) as pilot:
            screen = await ready(app, pilot)
            await pilot.press("f3")
            app.screen.query_one("#memory_budget").value = "lots"
            await pilot.click("#apply")
            assert "cannot read the memory size 'lots'" in str(app.screen.query_one("#settings-error").render())
            app.screen.query_one("#memory_budget").value = "1KiB"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is screen and screen.session.settings.memory_budget == ""
    asyncio.run(scenario())


@pytest.mark.slow
def test_reopen_a_saved_chat_and_skip_a_damaged_file(make_app, tmp_path):
    async def scenario():
        app = make_app()
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await ready(app, pilot)
            await send(app, pilot, "remember me")
            reply = screen.session.last_reply()
            (tmp_path / "chats" / "broken.json").write_text("{ not json")
            saved = json.loads(next((tmp_path / "chats").glob("2*.json")).read_text())
            damaged = {"updated-as-text": {**saved, "id": "a", "updated": "yesterday"},
                       "message-as-text": {**saved, "id": "b", "messages": ["hello"]},
                       "title-as-number": {**saved, "id": "c", "title": 7}}
            for name, data in damaged.items():
                (tmp_path / "chats" / f"{name}.json").write_text(json.dumps(data))
            await pilot.press("ctrl+n")
            await pilot.pause()
            assert not list(screen.query(MessageView))
            await pilot.press("ctrl+o")
            assert isinstance(app.screen, HistoryScreen)
            assert [chat.error is None for chat in app.screen.chats].count(True) == 1
            errors = {chat.path.stem: chat.error for chat in app.screen.chats if chat.error}
            assert set(errors) == {"broken", *damaged}
            assert "'updated' is str" in errors["updated-as-text"] and "message 0" in errors["message-as-text"]
            readable = next(i for i, chat in enumerate(app.screen.chats) if chat.error is None)
            app.screen.query_one("#history-list").highlighted = readable
            await pilot.press("enter")
            await pilot.pause()
            await pilot.pause()
            assert app.screen is screen
            views = list(screen.query(MessageView))
            assert [v.text for v in views] == ["remember me", reply]
            assert (tmp_path / "chats" / "broken.json").read_text() == "{ not json"  # left untouched
    asyncio.run(scenario())


@pytest.mark.slow
def test_regenerate_copy_and_input_history(make_app):
    async def scenario():
        app = make_app()
        async with app.run_test() as pilot:
            screen = await ready(app, pilot)
            await send(app, pilot, "one")
            first = screen.session.last_reply()
            await pilot.press("ctrl+r")
            await settle(app, pilot)
            assert [m["role"] for m in screen.session.conversation.messages] == ["user", "assistant"]
            assert screen.session.last_reply() == first  # greedy: the same answer again
            assert len(list(screen.query(MessageView))) == 2
            await pilot.press("ctrl+y")
            assert app.clipboard == first
            prompt = screen.query_one(PromptInput)
            await pilot.press("up")
            assert prompt.text == "one"
            await pilot.press("down")
            assert prompt.text == ""
            await pilot.press("a", "shift+enter", "b")
            assert prompt.text == "a\nb"  # multi-line input
    asyncio.run(scenario())


def test_a_missing_model_is_a_readable_message_not_a_traceback(make_app, tmp_path):
    async def scenario():
        app = make_app(model=tmp_path / "no-such-model")
        async with app.run_test() as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert isinstance(app.screen, LoadingScreen) and app.screen.failed
            assert "does not exist" in app.load_error
            await pilot.press("q")
        assert app.return_code == 2
    asyncio.run(scenario())


def panel_text(panel: StatsPanel) -> str:
    console = Console(width=60, file=io.StringIO())
    console.print(panel.content)
    return console.file.getvalue()


def test_the_speedup_is_shown_against_a_baseline_measured_once_edge_is_otherwise_quiet(tiny_model, tmp_path,
                                                                                     monkeypatch):
    busy = threading.Event()  # another edge job (a kernel build, a benchmark) runs until cleared
    busy.set()
    monkeypatch.setattr(activity, "other_edge_work", lambda sample_s=0.5: ["edge-bench"] if busy.is_set() else [])
    monkeypatch.setattr(session_module, "QUIET_POLL_S", 0.01)

    async def scenario():
        loader = SessionLoader(tiny_model, ChatSettings(drafter="ngram").replace(max_new_tokens=16), ConversationStore(tmp_path))
        app = EdgeChatApp(loader, memory_probe=lambda: RSS)
        async with app.run_test() as pilot:
            for _ in range(2000):  # the chat is up while the baseline still waits
                if isinstance(app.screen, ChatScreen):
                    break
                await pilot.pause(0.01)
            await pilot.pause()
            screen = app.screen
            panel = screen.query_one(StatsPanel)
            assert "measuring" in panel_text(panel) and screen.session.baseline_tokens_per_s is None
            busy.clear()
            screen = await ready(app, pilot)
            assert screen.session.baseline_tokens_per_s > 0 and "measuring" not in panel_text(panel)
            assert screen.session.engine.history == []  # the measurement leaves no trace in the chat's cache
            await send(app, pilot, "hi")
            stats = screen.session.outcome.event.stats
            assert panel.speedup == pytest.approx(stats.tokens_per_s / screen.session.baseline_tokens_per_s)
    asyncio.run(scenario())


def test_quitting_while_the_baseline_waits_for_quiet_measures_nothing(tiny_model, tmp_path, monkeypatch):
    looks = {"count": 0, "over": False}

    def never_quiet(sample_s=0.5):
        if looks["over"]:  # a worker still looking after the app ended: end it, or the test would hang
            raise RuntimeError("still waiting after the app ended")
        looks["count"] += 1
        return [activity.KERNEL_BUILD]

    monkeypatch.setattr(activity, "other_edge_work", never_quiet)
    monkeypatch.setattr(session_module, "QUIET_POLL_S", 0.01)
    session = ChatSession(None, ChatSettings(), None)
    stop = threading.Event()
    stop.set()
    assert session.measure_baseline(stop=stop) is None and session.baseline_tokens_per_s is None

    async def scenario():
        app = EdgeChatApp(SessionLoader(tiny_model, ChatSettings(), ConversationStore(tmp_path)),
                          memory_probe=lambda: RSS)
        async with app.run_test() as pilot:
            for _ in range(2000):
                if isinstance(app.screen, ChatScreen):
                    break
                await pilot.pause(0.01)
            chatting = isinstance(app.screen, ChatScreen) and app.screen.session.baseline_pending
            await pilot.press("ctrl+q")  # the waiting worker is cancelled: the app ends
        count = looks["count"]
        await asyncio.sleep(0.3)
        stopped = looks["count"] == count
        looks["over"] = True
        return chatting, stopped
    assert asyncio.run(scenario()) == (True, True)


def test_conversation_store_writes_atomically(tmp_path, monkeypatch):
    store = ConversationStore(tmp_path)
    chat = Conversation(messages=[{"role": "user", "content": "keep me"}])
    path = store.save(chat)
    chat.messages.append({"role": "assistant", "content": "new"})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", crash)
    with pytest.raises(OSError):
        store.save(chat)
    assert json.loads(path.read_text())["messages"] == [{"role": "user", "content": "keep me"}]
    assert sorted(p.name for p in (tmp_path / "chats").iterdir()) == [path.name]  # no temporary file left


def test_command_line_options_reach_the_app_settings():
    from edge.tui.cli import app_settings, build_parser

    args = build_parser().parse_args(["--temperature", "0.7", "--top-k", "20", "--min-p", "0.05", "--seed", "3",
                                      "--stop", "END", "--max-new-tokens", "99", "--drafter", "ngram",
                                      "--system", "Be brief."])
    settings = app_settings(args)
    options = settings.generation_options()
    assert (options.temperature, options.top_k, options.min_p, options.seed, options.stop) == (0.7, 20, 0.05, 3,
                                                                                             ("END",))
    assert (settings.options.max_new_tokens, settings.drafter, settings.system_prompt) == (99, "ngram", "Be brief.")


def test_a_tight_memory_budget_is_planned_and_the_step_downs_are_shown(tiny_model, tmp_path):
    plan = Engine.load(tiny_model, max_context=512, drafter="ngram", memory_budget=1 << 30).plan

    async def scenario():
        loader = SessionLoader(tiny_model, ChatSettings(drafter="ngram").replace(max_new_tokens=8), ConversationStore(tmp_path),
                               max_context=512, measure_baseline=False, memory_budget=str(plan.lower_bound + 1024))
        app = EdgeChatApp(loader, memory_probe=lambda: RSS)
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await ready(app, pilot)
            assert screen.session.plan_steps and screen.session.engine.cache.max_len < 512
            assert "memory plan: context 512" in str(screen.query_one("#status").render())
            await send(app, pilot, "hello")
            assert screen.session.last_reply() is not None
    asyncio.run(scenario())


@pytest.mark.slow
def test_a_chat_that_fills_the_context_keeps_going_without_its_oldest_turns(tiny_model, tmp_path):
    async def scenario():
        loader = SessionLoader(tiny_model, ChatSettings(system_prompt="Be brief.").replace(max_new_tokens=8),
                               ConversationStore(tmp_path), max_context=160, measure_baseline=False)
        app = EdgeChatApp(loader, memory_probe=lambda: RSS)
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await ready(app, pilot)
            for index in range(6):
                await send(app, pilot, f"question {index} about the quick brown fox and the lazy dog")
            assert screen.session.dropped_turns > 0
            assert "context full" in str(screen.query_one("#status").render())
            assert len(screen.session.conversation.messages) == 12  # the saved chat keeps every turn
    asyncio.run(scenario())


@pytest.mark.slow
def test_the_app_chats_on_an_exported_bundle_with_its_drafter(make_app, tiny_model, tmp_path):
    pytest.importorskip("onnx")
    from edge.export.bundle import ExportOptions, export_bundle
    from edge.export.quantize import QuantSettings

    bundle = tmp_path / "tiny.bundle"
    export_bundle(tiny_model, bundle, ExportOptions(quant=QuantSettings("int8"), drafter=str(tiny_model)),
                  show_progress=False)

    async def scenario():
        app = make_app(bundle, drafter="bundle")
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await ready(app, pilot)
            await send(app, pilot, "hello there")
            views = list(screen.query(MessageView))
            expected = reference_reply(bundle, [{"role": "user", "content": "hello there"}], 24)
            assert views[1].text == expected and expected
            stats = screen.query_one(StatsPanel).figures.stats
            assert stats.generated_tokens == 24 and stats.drafted > 0
    asyncio.run(scenario())


def key_name(key: str) -> str:
    """A binding's key as the palette's help writes it: ctrl+q -> Ctrl+Q, escape -> Esc, f3 -> F3."""
    return {"escape": "Esc"}.get(key) or "+".join(part.capitalize() if len(part) > 1 else part.upper()
                                                  for part in key.split("+"))


def shown_text(widget) -> str:
    """The lines a widget draws, border included, as text."""
    return "\n".join(line.text for line in widget.render_lines(widget.region.reset_offset))


def visible_footer_keys(screen) -> set[str]:
    """The footer's keys drawn whole at the current width, left of the command palette's key."""
    from textual.widgets._footer import FooterKey

    keys = list(screen.query(FooterKey))
    palette = next(key for key in keys if key.has_class("-command-palette"))
    return {key.key for key in keys if key is palette or (key.region.width and key.region.right <= palette.region.x)}


def test_every_key_is_in_the_footer_at_80_columns_and_in_the_palette_with_its_key(make_app):
    from textual.binding import Binding

    async def scenario():
        app = make_app(max_new_tokens=400)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await ready(app, pilot)
            bindings = [b for b in (*ChatScreen.BINDINGS, *EdgeChatApp.BINDINGS) if isinstance(b, Binding)]
            helps = " | ".join(command.help for command in app.get_system_commands(screen))
            for binding in bindings:  # the palette names every key
                assert key_name(binding.key) in helps, binding.key
            shown = {b.key for b in bindings if b.show}
            idle = visible_footer_keys(screen)
            assert shown - {"escape"} <= idle and "ctrl+q" in idle and "ctrl+p" in idle  # nothing cut off
            gate = await start_slow_reply(screen, pilot, "tell me everything")
            await pilot.pause()
            await pilot.pause()
            streaming = visible_footer_keys(screen)
            assert shown - {"ctrl+r"} <= streaming and "escape" in streaming  # Esc stops the reply that streams
            await pilot.press("escape")
            gate.set()
            await settle(app, pilot)
    asyncio.run(scenario())


def test_the_colours_legend_sits_above_the_input_and_covers_nothing(make_app):
    async def scenario():
        app = make_app(drafter="ngram", max_new_tokens=8)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await ready(app, pilot)
            await send(app, pilot, "the cat the cat")
            legend = screen.query_one("#legend")
            assert not legend.display
            await pilot.press("f2")
            await pilot.pause()
            prompt, messages = screen.query_one(PromptInput), screen.query_one("#messages")
            assert legend.display and "drafted and accepted" in str(legend.render())
            assert legend.region.bottom <= prompt.region.y and legend.region.y >= messages.region.bottom
            assert not app._notifications  # no toast over the input
            await pilot.press("f2")
            await pilot.pause()
            assert not legend.display
    asyncio.run(scenario())


def test_settings_show_each_drafter_name_whole_and_the_repetition_guard(make_app):
    from rich.cells import cell_len
    from textual.widgets import Select

    from edge.tui.settings import DRAFTER_CHOICES

    async def scenario():
        app = make_app(temperature=0.8)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(app, pilot)
            await pilot.press("f3")
            await pilot.pause()
            settings = app.screen
            select = settings.query_one("#drafter", Select)
            for name, value in DRAFTER_CHOICES:
                select.value = value
                await pilot.pause()
                label = select.query_one("SelectCurrent #label")
                assert str(label.render()) == name and cell_len(name) <= label.content_region.width, name
            guard = settings.query_one("#repetition-guard")
            assert str(guard.render()) == ("repetition guard: penalty 1.1 over the last 64 tokens, sampling's "
                                           "default; loop stop after 64 tokens")
            settings.query_one("#repetition_penalty").value = "1.3"
            settings.query_one("#loop_stop").value = "0"
            await pilot.pause()
            assert str(guard.render()) == "repetition guard: penalty 1.3 over the last 64 tokens; loop stop off"
            settings.query_one("#repeat_last_n").value = "many"
            await pilot.pause()
            assert "not valid yet" in str(guard.render())
    asyncio.run(scenario())


def test_a_new_chat_clears_the_last_replys_figures(make_app):
    async def scenario():
        app = make_app(drafter="ngram", max_new_tokens=8)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await ready(app, pilot)
            await send(app, pilot, "hello")
            panel = screen.query_one(StatsPanel)
            assert panel.figures.stats.generated_tokens == 8
            await pilot.press("ctrl+n")
            await pilot.pause()
            assert panel.figures.stats is None and panel.figures.drafter == "ngram"
            rows = [row.strip("│ ").split() for row in shown_text(screen.query_one("#stats")).splitlines()]
            assert [row for row in rows if row[:1] in (["tokens"], ["tokens/s"], ["accepted"])] == [
                ["tokens/s", "-"], ["accepted", "-"], ["tokens", "-"]]
    asyncio.run(scenario())


def test_the_memory_panel_explains_plan_and_resident_and_judges_the_gap(make_app):
    async def scenario():
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await ready(app, pilot)
            memory = screen.query_one("#memory")
            text = shown_text(memory)
            assert "plan: weights + KV + drafter" in text and "resident: RAM of the process" in text
            assert "normal: runtime 300 MiB + plan" in text  # the probe's 300 MiB before and after the load
            assert memory.region.bottom <= screen.query_one("#status").region.y  # all of it on an 80x24 screen
    asyncio.run(scenario())
