"""Saved conversations: one JSON file per chat in the user's data directory, written atomically.

    $EDGE_DATA_DIR/chats/<id>.json, default ~/.local/share/edge/chats (the platform's user data directory)

A write goes to a temporary file in the same folder, is flushed to disk, and replaces the old file in one rename,
so a crash leaves either the old or the new version, never a torn file. A file that cannot be read is listed as
unreadable, with the reason, and left untouched, never overwritten. Only regular files of at most MAX_CHAT_BYTES
are read (a named pipe or a symlink to /dev/zero under a chat's name is listed as what it is, never opened for
reading), and their JSON only MAX_DEPTH brackets deep. A chat's id is its file name: letters, digits, '.', '_' and
'-', not starting with a dot, so that no id names a file outside the folder.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edge.sources.data_dir import default_data_dir
from edge.files import FileRefused, read_regular

FORMAT_VERSION = 1
MAX_CHAT_BYTES = 64 * 2**20  # a chat of a thousand long replies is a few MiB
MAX_DEPTH = 64  # brackets deep; a saved chat nests four or five
CHAT_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
FIELD_TYPES = {"id": (str,), "title": (str,), "created": (float, int), "updated": (float, int), "model": (str,),
               "system": (str,), "messages": (list,)}  # what a saved chat's fields must be to be opened


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model: str = ""
    system: str = ""
    messages: list[dict] = field(default_factory=list)  # {"role", "content"} plus, for replies, "stats"

    def chat_messages(self) -> list[dict]:
        """What the chat template sees: the system prompt, then role and content of every turn."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m["role"], "content": m["content"]} for m in self.messages]

    def to_json(self) -> dict:
        return {"format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> "Conversation":
        if not isinstance(data, dict):
            raise ValueError(f"it holds a JSON {type(data).__name__}, not an edge-chat conversation (an object)")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"its format_version is {data.get('format_version')!r}, not {FORMAT_VERSION}: not an "
                             "edge-chat conversation, or one from another edge version")
        if not isinstance(data.get("messages"), list):
            raise ValueError("it has no list of messages: not an edge-chat conversation")
        fields = {key: value for key, value in data.items() if key in FIELD_TYPES}
        for key, value in fields.items():
            if not isinstance(value, FIELD_TYPES[key]) or isinstance(value, bool):
                raise ValueError(f"its {key!r} is {type(value).__name__}, not {FIELD_TYPES[key][0].__name__}")
        if "id" in fields:
            check_id(fields["id"])
        for index, message in enumerate(fields["messages"]):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise ValueError(f"message {index} is not a {{'role': str, 'content': str}} object")
        return cls(**fields)


@dataclass(frozen=True)
class SavedChat:
    path: Path
    title: str
    updated: float
    turns: int
    error: str | None = None  # why the file could not be read


def check_id(conversation_id: str) -> str:
    """`conversation_id` when it can name a file in the chats folder; ValueError otherwise."""
    if not isinstance(conversation_id, str) or not CHAT_ID.fullmatch(conversation_id):
        shown = conversation_id if isinstance(conversation_id, str) else type(conversation_id).__name__
        raise ValueError(f"its id {shown[:80]!r} is not a chat id (letters, digits, '.', '_' and '-', not "
                         "starting with a dot, at most 128)")
    return conversation_id


def parse_chat(data: bytes) -> object:
    """The JSON value of a chat file's bytes, refused (ValueError) when nested more than MAX_DEPTH deep, so that no
    file can exhaust the parser's recursion."""
    text = data.decode("utf-8")
    if _depth(data) > MAX_DEPTH:
        raise ValueError(f"its JSON is nested more than {MAX_DEPTH} deep; a saved chat never is")
    try:
        return json.loads(text)
    except RecursionError:  # in case the count above missed a form of nesting
        raise ValueError(f"its JSON is nested more than {MAX_DEPTH} deep; a saved chat never is") from None


def _depth(data: bytes) -> int:
    """The deepest bracket nesting of JSON `data`, strings left out (counted in numpy: a file of brackets only is
    counted as fast as one of text)."""
    bare = re.sub(rb'"[^"\\]*(?:\\.[^"\\]*)*"', b"", data, flags=re.DOTALL)
    codes = np.frombuffer(bare, dtype=np.uint8)
    steps = (np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}"))))
    return int(steps.cumsum().max()) if steps.size else 0


class ConversationStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_data_dir()) / "chats"

    def path(self, conversation_id: str) -> Path:
        """The file of the chat `conversation_id` (ValueError for an id that could name a file elsewhere)."""
        return self.root / f"{check_id(conversation_id)}.json"

    def problem(self) -> str | None:
        """Why chats cannot be saved here, in one line naming the folder and the fix; None when they can (the
        folder is made if need be)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=".write-check.", dir=self.root)
            os.close(handle)
            os.unlink(probe)
        except OSError as error:
            return self.describe(error)
        return None

    def describe(self, error: OSError) -> str:
        """A failed save in one line: the folder, why, and the fix."""
        return (f"cannot save chats in {self.root} ({error.strerror or error}); this chat is kept in memory and "
                "saved once that works: make the folder writable, or set EDGE_DATA_DIR to a writable folder")

    def save(self, conversation: Conversation) -> Path:
        """Write the conversation atomically; an empty chat is not saved."""
        if not conversation.messages:
            return self.path(conversation.id)
        self.root.mkdir(parents=True, exist_ok=True)
        conversation.updated = time.time()
        target = self.path(conversation.id)
        handle, temporary = tempfile.mkstemp(prefix=f".{conversation.id}.", suffix=".tmp", dir=self.root)
        try:
            # backslashreplace: a lone surrogate (read from a "\ud800" escape; UTF-8 has no bytes for it) is
            # written as that escape again, inside its JSON string
            with os.fdopen(handle, "w", encoding="utf-8", errors="backslashreplace") as out:
                json.dump(conversation.to_json(), out, ensure_ascii=False, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return target

    def load(self, path: Path) -> Conversation:
        """The chat saved at `path`; ValueError, one line naming the file and the reason, when it cannot be read."""
        try:
            return Conversation.from_json(parse_chat(read_regular(path, MAX_CHAT_BYTES)))
        except FileRefused as error:
            raise ValueError(f"cannot open the saved chat {Path(path).name}: it is {error.reason}") from None
        except UnicodeDecodeError as error:
            raise ValueError(f"cannot open the saved chat {Path(path).name}: it is not UTF-8 text (byte "
                             f"{error.start})") from None
        except OSError as error:
            raise ValueError(f"cannot open the saved chat {Path(path).name}: {error.strerror or error}") from None
        except (ValueError, TypeError) as error:
            raise ValueError(f"cannot open the saved chat {Path(path).name}: {error}") from None

    def list(self) -> list[SavedChat]:
        """Saved chats, newest first; unreadable files are listed with the reason, never deleted."""
        chats = []
        try:
            paths = sorted(self.root.glob("*.json"))
        except OSError:  # the folder itself cannot be read: nothing to list
            paths = []
        for path in paths:
            try:
                conversation = self.load(path)
            except ValueError as error:
                chats.append(SavedChat(path, path.stem, _modified(path), 0, str(error)))
                continue
            chats.append(SavedChat(path, conversation.title, conversation.updated, len(conversation.messages)))
        return sorted(chats, key=lambda chat: chat.updated, reverse=True)


def _modified(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def title_from(text: str, width: int = 48) -> str:
    """A chat's title: the first line of its first message, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line if len(line) <= width else line[: width - 1] + "…"
