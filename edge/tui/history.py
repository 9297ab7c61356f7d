"""Saved conversations: one JSON file per chat in the user's data directory, written atomically.

    $EDGE_DATA_DIR/chats/<id>.json, default ~/.local/share/edge/chats (the platform's user data directory)

A write goes to a temporary file in the same folder, is flushed to disk, and replaces the old file in one rename,
so a crash leaves either the old or the new version, never a torn file. A file that cannot be read is listed as
unreadable and left untouched, never overwritten.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 1
FIELD_TYPES = {"id": (str,), "title": (str,), "created": (float, int), "updated": (float, int), "model": (str,),
               "system": (str,), "messages": (list,)}  # what a saved chat's fields must be to be opened


def default_data_dir() -> Path:
    override = os.environ.get("EDGE_DATA_DIR")
    if override:
        return Path(override)
    from platformdirs import user_data_dir

    return Path(user_data_dir("edge", appauthor=False))


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
        if data.get("format_version") != FORMAT_VERSION or not isinstance(data.get("messages"), list):
            raise ValueError("not an edge-chat conversation (format_version 1)")
        fields = {key: value for key, value in data.items() if key in FIELD_TYPES}
        for key, value in fields.items():
            if not isinstance(value, FIELD_TYPES[key]) or isinstance(value, bool):
                raise ValueError(f"its {key!r} is {type(value).__name__}, not {FIELD_TYPES[key][0].__name__}")
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


class ConversationStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_data_dir()) / "chats"

    def path(self, conversation_id: str) -> Path:
        return self.root / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        """Write the conversation atomically; an empty chat is not saved."""
        if not conversation.messages:
            return self.path(conversation.id)
        self.root.mkdir(parents=True, exist_ok=True)
        conversation.updated = time.time()
        target = self.path(conversation.id)
        handle, temporary = tempfile.mkstemp(prefix=f".{conversation.id}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(conversation.to_json(), out, ensure_ascii=False, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return target

    def load(self, path: Path) -> Conversation:
        try:
            return Conversation.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as error:
            raise ValueError(f"cannot open the saved chat {Path(path).name}: {error}") from None

    def list(self) -> list[SavedChat]:
        """Saved chats, newest first; unreadable files are listed with the reason, never deleted."""
        chats = []
        for path in self.root.glob("*.json"):
            try:
                conversation = self.load(path)
            except ValueError as error:
                chats.append(SavedChat(path, path.stem, path.stat().st_mtime, 0, str(error)))
                continue
            chats.append(SavedChat(path, conversation.title, conversation.updated, len(conversation.messages)))
        return sorted(chats, key=lambda chat: chat.updated, reverse=True)


def title_from(text: str, width: int = 48) -> str:
    """A chat's title: the first line of its first message, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line if len(line) <= width else line[: width - 1] + "…"
