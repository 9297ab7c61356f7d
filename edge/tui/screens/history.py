"""The saved chats, newest first; Enter opens one. Unreadable files are shown with the reason and left alone."""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from edge.tui.history import SavedChat


class HistoryScreen(ModalScreen[Path | None]):
    BINDINGS = [Binding("escape", "cancel", "Close")]

    def __init__(self, chats: list[SavedChat]) -> None:
        super().__init__()
        self.chats = chats

    def compose(self) -> ComposeResult:
        with Vertical(id="history-box"):
            yield Label(f"Saved chats ({len(self.chats)})", id="history-title")
            options = [
                Option(Text(_describe(chat)), id=str(index), disabled=chat.error is not None)
                for index, chat in enumerate(self.chats)
            ]
            yield OptionList(*options, id="history-list")
            if not self.chats:
                yield Label("No saved chats yet: a chat is saved after each reply.")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.chats[int(event.option.id)].path)

    def action_cancel(self) -> None:
        self.dismiss(None)


def _describe(chat: SavedChat) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
    if chat.error:
        return f"{when}  (unreadable: {chat.error})"
    return f"{when}  {chat.title}  [{chat.turns} messages]"
