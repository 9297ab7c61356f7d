"""The message input: Enter sends, Shift+Enter or Ctrl+J adds a line, Up/Down walk through earlier messages."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        prompt: "PromptInput"
        text: str

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.sent: list[str] = []  # earlier messages, oldest first
        self._browse: int | None = None  # index into `sent` while walking the history
        self._draft = ""  # what was typed before walking the history

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.post_message(self.Submitted(self, text))
            return
        if event.key in ("shift+enter", "ctrl+j", "alt+enter"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "up" and self.cursor_at_first_line and self.sent:
            event.stop()
            event.prevent_default()
            self._walk(-1)
            return
        if event.key == "down" and self.cursor_at_last_line and self._browse is not None:
            event.stop()
            event.prevent_default()
            self._walk(+1)
            return
        await super()._on_key(event)

    def remember(self, text: str) -> None:
        """Record a sent message and clear the input."""
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
        self._browse, self._draft = None, ""
        self.clear()

    def _walk(self, direction: int) -> None:
        if self._browse is None:
            self._draft, self._browse = self.text, len(self.sent)
        self._browse = max(0, self._browse + direction)
        if self._browse >= len(self.sent):
            self._browse = None
            self.load_text(self._draft)
        else:
            self.load_text(self.sent[self._browse])
        self.move_cursor(self.document.end)
