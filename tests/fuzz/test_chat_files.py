"""Fuzzed chats folders: files under `*.json` names holding arbitrary bytes, arbitrary JSON, conversation-shaped
JSON with any value in any field, deep brackets, or being what no chat is (a named pipe, a symlink to /dev/zero,
a dangling symlink, a folder, a sparse file over the size cap). The chat list (edge-chat's Ctrl+O) lists every file,
opened or with a one-line reason, within the time limit and without raising; every chat it opens can be saved back
into the folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hypothesis import event
from hypothesis import strategies as st

from edge.tui.history import MAX_CHAT_BYTES, ConversationStore
from tests.fuzz import harness

LIMIT_S = 10.0
surrogates = st.lists(st.characters(categories=["Cs"]) | st.characters(max_codepoint=127), max_size=6).map("".join)
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | surrogates  # lone surrogates: as
# JSON's "\ud800" escapes read
scalars = st.none() | st.booleans() | st.integers() | st.floats() | any_text
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(any_text, inner, max_size=3), max_leaves=8)
ids = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}", fullmatch=True) | st.sampled_from(
    ["../../escape", "..", ".hidden", "a/b", "a\\b", "", "x" * 200, "\0", "chat\n"]) | any_text
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]) | any_text,
                                 "content": any_text}, optional={"stats": json_values})
# plausible: every field of its type (any text, any number), so that most files open; wild: anything anywhere
plausible = st.fixed_dictionaries(
    {"format_version": st.just(1), "messages": st.lists(message, max_size=3)},
    optional={"id": ids, "title": any_text, "created": st.floats(), "updated": st.floats() | st.integers(),
              "model": any_text, "system": any_text, "extra": json_values})
wild = st.fixed_dictionaries(
    {"format_version": st.just(1) | json_values, "messages": st.lists(message | json_values, max_size=3)},
    optional={"id": ids | json_values, "title": json_values, "created": json_values, "updated": json_values,
              "model": json_values, "system": json_values})
NESTINGS = {"[": "]", "{\"a\":": "}", "[{\"b\":": "}]"}  # an opening and its closing
brackets = st.tuples(st.sampled_from(sorted(NESTINGS)), st.integers(0, 200_000), st.booleans()).map(
    lambda deep: (deep[0] * deep[1] + ("1" + NESTINGS[deep[0]] * deep[1] if deep[2] else "")).encode())
contents = st.one_of(
    st.binary(max_size=64),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.tuples(plausible | wild, st.booleans()).map(
        lambda pair: json.dumps(pair[0], ensure_ascii=pair[1]).encode("utf-8", "surrogatepass")),
    brackets,
)
SPECIAL = ["fifo", "dev-zero", "dangling", "folder", "oversized", "loop"]
files = st.dictionaries(st.from_regex(r"[A-Za-z0-9 ._-]{1,12}", fullmatch=True),
                        contents | st.sampled_from(SPECIAL), min_size=1, max_size=4)


def place(folder: Path, name: str, content: bytes | str) -> None:
    path = folder / f"{name}.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "fifo":
        os.mkfifo(path)
    elif content == "dev-zero":
        path.symlink_to("/dev/zero")
    elif content == "dangling":
        path.symlink_to(folder / "nowhere")
    elif content == "folder":
        path.mkdir()
    elif content == "loop":
        path.symlink_to(path)
    else:
        with open(path, "wb") as out:
            out.truncate(MAX_CHAT_BYTES + 1)  # sparse: nothing written


def test_the_chat_list_names_every_file_or_its_reason(tmp_path):
    def one_folder(files):
        root = tmp_path / "data"
        shutil.rmtree(root, ignore_errors=True)
        folder = root / "chats"
        folder.mkdir(parents=True)
        for name, content in files.items():
            place(folder, name, content)
        listed = sorted(path.name for path in folder.glob("*.json"))  # glob: not the names starting with '.'
        store = ConversationStore(root)
        with harness.limited(LIMIT_S, files):
            chats = store.list()
            assert sorted(chat.path.name for chat in chats) == listed
            for chat in chats:
                if chat.error is not None:
                    assert chat.error.strip() and "\n" not in chat.error, chat.error
                    event("listed with its reason")
                    continue
                conversation = store.load(chat.path)
                saved = store.save(conversation)  # an opened chat can be saved back (a turn is kept)
                assert saved.parent == folder and saved.is_file() == bool(conversation.messages)  # empty: not saved
                event("opened")

    harness.run(one_folder, files=files)
