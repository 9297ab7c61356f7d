"""EdgeChatApp: a loading screen while the model loads in a worker, then the chat."""

from __future__ import annotations

from typing import Callable, Iterable

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from edge.errors import EdgeError
from edge.tui.loader import SessionLoader
from edge.tui.screens.chat import ChatScreen, resident_bytes
from edge.tui.screens.loading import LoadingScreen
from edge.tui.session import ChatSession


class EdgeChatApp(App):
    CSS_PATH = "edge_chat.tcss"
    TITLE = "edge-chat"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", tooltip="Quit edge-chat (the chat is saved).", priority=True)]

    def __init__(self, loader: SessionLoader, *, drafters: list[tuple[str, str]] | None = None,
                 memory_probe: Callable[[], int] | None = None) -> None:
        super().__init__()
        self.loader, self.drafters, self.memory_probe = loader, drafters, memory_probe
        self.session: ChatSession | None = None
        self.load_error: str | None = None  # set when loading failed (shown on the loading screen)
        self.runtime_bytes: int | None = None  # resident memory before the model loaded: Python, torch, the app

    def on_mount(self) -> None:
        self.push_screen(LoadingScreen(self.loader.name))
        self.load_session()

    @work(thread=True, exclusive=True, group="load")
    def load_session(self) -> None:
        screen = self.screen
        progress = lambda stage, fraction: self.call_from_thread(screen.progress, stage, fraction)  # noqa: E731
        self.runtime_bytes = (self.memory_probe or resident_bytes)()
        try:
            session = self.loader.load(progress)
        except (EdgeError, OSError) as error:
            self.call_from_thread(screen.show_error, str(error))
            return
        self.call_from_thread(self.show_chat, session)

    def show_chat(self, session: ChatSession) -> None:
        self.session = session
        self.switch_screen(ChatScreen(session, drafters=self.drafters, memory_probe=self.memory_probe,
                                      runtime_bytes=self.runtime_bytes))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's own commands, Quit with its key, and on the chat every action with its key."""
        for command in super().get_system_commands(screen):
            yield command._replace(help="Ctrl+Q · quit edge-chat (the chat is saved)") if command.title == "Quit" \
                else command
        if isinstance(screen, ChatScreen):
            yield SystemCommand("Stop the reply", "Esc or Ctrl+C · stop the reply that streams (Ctrl+C with nothing "
                                "streaming copies the selection, else says how to quit)", screen.action_stop)
            yield SystemCommand("Toggle provenance colours", "F2 · colour each token by who produced it: drafted "
                                "and accepted, or from the model", screen.action_toggle_provenance)
            yield SystemCommand("Settings", "F3 · drafter, sampling, repetition guard, max tokens, memory budget, "
                                "system prompt", screen.action_settings)
            yield SystemCommand("New chat", "Ctrl+N · start over (the current chat stays saved)",
                                screen.action_new_chat)
            yield SystemCommand("Open a saved chat", "Ctrl+O · reopen an earlier conversation", screen.action_open_chat)
            yield SystemCommand("Regenerate", "Ctrl+R · answer the last message again", screen.action_regenerate)
            yield SystemCommand("Copy the last reply", "Ctrl+Y · to the clipboard", screen.action_copy_reply)
