"""The chats folder as it is found, not as edge-chat left it: pipes, devices, huge or deeply nested files, ids that
name files elsewhere, and a data folder that cannot be written. Every bad file is listed with its reason (never
read for ever, never a traceback), and a chat that cannot be saved goes on in memory."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from edge.tui.history import MAX_CHAT_BYTES, Conversation, ConversationStore
from edge.tui.session import ChatSession
from edge.tui.settings import ChatSettings


def listed_within(store: ConversationStore, seconds: float = 10.0):
    """store.list(), failing (rather than hanging the run) when it does not return within `seconds`."""
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("chats", store.list()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert "chats" in result, f"listing the chats did not finish within {seconds} s"
    return {chat.path.name: chat for chat in result["chats"]}


@pytest.fixture
def store(tmp_path) -> ConversationStore:
    store = ConversationStore(tmp_path)
    store.save(Conversation(id="fine", title="a good chat", messages=[{"role": "user", "content": "hi"}]))
    return store


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_listed_as_one_and_never_read(store):
    os.mkfifo(store.root / "x.json")
    chats = listed_within(store)
    assert chats["x.json"].error == "cannot open the saved chat x.json: it is a named pipe"
    assert chats["fine.json"].error is None and chats["fine.json"].title == "a good chat"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_symlink_to_a_device_is_listed_as_one_and_never_read(store):
    (store.root / "zero.json").symlink_to("/dev/zero")
    chats = listed_within(store)
    assert chats["zero.json"].error == ("cannot open the saved chat zero.json: it is a symlink to /dev/zero, a "
                                        "character device")


def test_a_file_over_the_size_limit_is_listed_with_its_size(store):
    with open(store.root / "huge.json", "wb") as handle:
        handle.truncate(MAX_CHAT_BYTES + 1)  # sparse: no disk used
    error = listed_within(store)["huge.json"].error
    assert "huge.json: it is 64.0 MiB, over the 64.0 MiB a file here may hold" in error


@pytest.mark.parametrize("content, reason", [
    ("[]", "it holds a JSON list, not an edge-chat conversation"),
    ("7", "it holds a JSON int, not an edge-chat conversation"),
    ("[" * 100_000 + "]" * 100_000, "its JSON is nested more than 64 deep"),
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "its JSON is nested more than 64 deep"),
    ("\xff\xfe", "it is not UTF-8 text"),
    ('{"id": "x", "messages": []}', "its format_version is None, not 1: not an edge-chat conversation"),
    ('{"format_version": 1, "messages": "no"}', "it has no list of messages"),
], ids=["empty-list", "number", "deep-lists", "deep-objects", "not-utf8", "no-version", "no-messages"])
def test_a_file_holding_no_chat_is_listed_with_the_reason(store, content, reason):
    (store.root / "odd.json").write_bytes(content.encode("latin-1"))
    chats = listed_within(store)
    assert reason in chats["odd.json"].error and "\n" not in chats["odd.json"].error
    assert chats["fine.json"].error is None


def test_brackets_inside_strings_do_not_count_as_nesting(store):
    chat = Conversation(id="deep-text", messages=[{"role": "user", "content": "[" * 10_000 + '"{\\"' * 100}])
    store.save(chat)
    assert store.load(store.path("deep-text")).messages == chat.messages


def test_a_chat_holding_lone_surrogates_saves_back_as_it_was_read(store):
    """JSON's "\\ud800" escapes read as lone surrogates, which UTF-8 cannot encode: saving such a chat again (its
    next turn) must not fail."""
    (store.root / "odd.json").write_text('{"format_version": 1, "id": "odd", "title": "\\udc00", '
                                         '"messages": [{"role": "user", "content": "a\\ud800b"}]}')
    chat = store.load(store.root / "odd.json")
    assert chat.messages[0]["content"] == "a\ud800b"
    store.save(chat)
    again = store.load(store.root / "odd.json")
    assert (again.title, again.messages) == ("\udc00", chat.messages)


@pytest.mark.parametrize("bad_id", ["../../escape", "a/b", ".hidden", "..", "", "x" * 200, "a\\b", "nul\0"],
                         ids=["escape", "separator", "dot", "dots", "empty", "long", "backslash", "nul"])
def test_a_chat_id_that_could_name_a_file_elsewhere_is_refused(store, tmp_path, bad_id):
    saved = json.loads((store.root / "fine.json").read_text())
    (store.root / "escape.json").write_text(json.dumps({**saved, "id": bad_id}))
    assert "is not a chat id" in listed_within(store)["escape.json"].error
    with pytest.raises(ValueError, match="is not a chat id"):
        store.path(bad_id)
    with pytest.raises(ValueError, match="is not a chat id"):
        store.save(Conversation(id=bad_id, messages=[{"role": "user", "content": "hi"}]))
    assert sorted(path.name for path in tmp_path.rglob("*.json")) == ["escape.json", "fine.json"]


def test_an_unwritable_data_folder_is_one_line_and_the_chat_goes_on_in_memory(tmp_path):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data folder should be")
    session = ChatSession(None, ChatSettings(), ConversationStore(blocker))
    assert "cannot save chats in" in session.save_problem and "EDGE_DATA_DIR" in session.save_problem
    session.begin("first")
    assert session.save() is False and session.conversation.messages[0]["content"] == "first"
    blocker.unlink()  # the folder can be made now: the next save stores every turn kept so far
    session.begin("second")
    assert session.save() is True and session.save_problem is None
    saved = json.loads(next((blocker / "chats").glob("*.json")).read_text())
    assert [m["content"] for m in saved["messages"]] == ["first", "second"]


class PipedLines:
    """Text piped into edge-chat --plain, one message a line; `on_line(index)` runs before each line is read."""

    def __init__(self, lines: list[str], on_line) -> None:
        self.lines, self.on_line = lines, on_line

    def isatty(self) -> bool:
        return False

    def __iter__(self):
        for index, line in enumerate(self.lines):
            self.on_line(index)
            yield line + "\n"


def test_plain_chat_with_an_unwritable_data_folder_answers_every_message_and_saves_once_it_can(
        llama_dir, tmp_path, monkeypatch, capsys):
    from edge.tui.cli import main as chat_main

    blocker = tmp_path / "data"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EDGE_DATA_DIR", str(blocker))
    messages = ["hello", "and again", "third", "fourth"]

    def unblock(index: int) -> None:  # once two messages were answered, the data folder becomes writable
        if index == 2:
            blocker.unlink()

    monkeypatch.setattr(sys, "stdin", PipedLines(messages, unblock))
    assert chat_main([str(llama_dir), "--plain", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == len(messages)  # a reply per message
    assert "Traceback" not in captured.err
    assert captured.err.count("cannot save chats in") == 1 and "kept in memory" in captured.err
    assert "saved again" in captured.err
    saved = json.loads(next((blocker / "chats").glob("*.json")).read_text())
    assert [m["content"] for m in saved["messages"] if m["role"] == "user"] == messages  # no turn lost
