"""Shown while the model loads: each stage with a progress bar; a readable message if loading fails."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import Label, ProgressBar


class LoadingScreen(Screen):
    BINDINGS = [Binding("q,escape", "quit", "Quit")]

    def __init__(self, model_name: str) -> None:
        super().__init__()
        self.model_name = model_name
        self.failed = False

    def compose(self) -> ComposeResult:
        with Center():
            with Vertical(id="loading-box"):
                yield Label(Text(f"edge-chat — loading {self.model_name}"), id="loading-title")
                yield ProgressBar(total=1.0, show_eta=False, id="loading-progress")
                yield Label("starting", id="loading-stage")

    def progress(self, stage: str, fraction: float) -> None:
        self.query_one(ProgressBar).update(progress=fraction)
        self.query_one("#loading-stage", Label).update(Text(stage))

    def action_quit(self) -> None:
        self.app.exit(return_code=2 if self.failed else 0)

    def show_error(self, message: str) -> None:
        self.failed = True
        self.app.load_error = message
        self.query_one(ProgressBar).display = False
        stage = self.query_one("#loading-stage", Label)
        stage.add_class("error")
        stage.update(Text(f"{message}\n\nPress q to quit."))
