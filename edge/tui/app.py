"""EdgeChatApp: a loading screen while the model loads in a worker, then the chat."""

from __future__ import annotations

from typing import Callable, Iterable

from textual import work
from textual.app import App, SystemCommand
from textual.screen import Screen

from edge.errors import EdgeError
from edge.tui.loader import SessionLoader
from edge.tui.screens.chat import ChatScreen
from edge.tui.screens.loading import LoadingScreen
from edge.tui.session import ChatSession


class EdgeChatApp(App):
    CSS_PATH = "edge_chat.tcss"
    TITLE = "edge-chat"

    def __init__(self, loader: SessionLoader, *, drafters: list[tuple[str, str]] | None = None,
                 memory_probe: Callable[[], int] | None = None) -> None:
        super().__init__()
        self.loader, self.drafters, self.memory_probe = loader, drafters, memory_probe
        self.session: ChatSession | None = None
        self.load_error: str | None = None  # set when loading failed (shown on the loading screen)

    def on_mount(self) -> None:
        self.push_screen(LoadingScreen(self.loader.name))
        self.load_session()

    @work(thread=True, exclusive=True, group="load")
    def load_session(self) -> None:
        screen = self.screen
        progress = lambda stage, fraction: self.call_from_thread(screen.progress, stage, fraction)  # noqa: E731
        try:
            session = self.loader.load(progress)
        except (EdgeError, OSError) as error:
            self.call_from_thread(screen.show_error, str(error))
            return
        self.call_from_thread(self.show_chat, session)

    def show_chat(self, session: ChatSession) -> None:
        self.session = session
        self.switch_screen(ChatScreen(session, drafters=self.drafters, memory_probe=self.memory_probe))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, ChatScreen):
            yield SystemCommand("Settings", "Drafter, sampling, max tokens, memory budget, system prompt",
                                screen.action_settings)
            yield SystemCommand("Open a saved chat", "Reopen an earlier conversation", screen.action_open_chat)
            yield SystemCommand("New chat", "Start over (the current chat stays saved)", screen.action_new_chat)
            yield SystemCommand("Regenerate", "Answer the last message again", screen.action_regenerate)
            yield SystemCommand("Toggle provenance colours", "Colour drafted-and-accepted vs target tokens",
                                screen.action_toggle_provenance)
            yield SystemCommand("Copy the last reply", "To the clipboard", screen.action_copy_reply)
