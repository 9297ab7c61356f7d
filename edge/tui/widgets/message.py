"""One chat message: Markdown (streamed) or, with provenance on, plain text coloured by who produced each token."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Markdown, Static

from edge.tui.provenance import extend_runs

# Blue against orange: apart in hue and for colour-blind eyes, and both entries of the 256-colour palette (75 and
# 214), so a 256-colour terminal shows the very colours a truecolor one does
DRAFTED_STYLE = "#5fafff"  # drafted by the drafter and accepted by the target
TARGET_STYLE = "#ffaf00"  # produced by the target itself


def provenance_legend() -> Text:
    """The one-line key to the colours, shown above the input while they are on."""
    return Text.assemble(("■ ", DRAFTED_STYLE), "drafted and accepted  ", ("■ ", TARGET_STYLE), "from the model")


class MessageView(Vertical):
    """A user or assistant message. `append` streams text in; `show_provenance` switches the rendering."""

    DEFAULT_CLASSES = "message"

    def __init__(self, role: str, text: str = "", runs: list[list[int]] | None = None, *, note: str = "") -> None:
        super().__init__(classes=f"message {role}")
        self.role, self.text, self.note = role, text, note
        self.runs: list[list[int]] = [list(run) for run in runs or []]  # [[characters, drafted 0/1], ...]
        self._stream = None
        self.provenance = False

    def compose(self) -> ComposeResult:
        yield Label("you" if self.role == "user" else "edge", classes="role")
        yield Markdown(self.text, classes="body")
        yield Static(self._coloured(), classes="provenance body")
        yield Label(self.note, classes="note")

    def on_mount(self) -> None:
        self.show_provenance(self.provenance)
        self.query_one(".note", Label).display = bool(self.note)

    async def append(self, pieces: list[tuple[str, bool]]) -> None:
        """Stream more reply text in: (text, drafted) pieces, drafted meaning proposed by the drafter and accepted."""
        new_text = "".join(text for text, _ in pieces)
        if not new_text:
            return
        self.text += new_text
        extend_runs(self.runs, pieces)
        if self.provenance:
            self.query_one(".provenance", Static).update(self._coloured())
        else:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one(Markdown))
            await self._stream.write(new_text)

    async def finish(self, note: str = "") -> None:
        """The reply ended: flush the Markdown stream and show the note (speed, acceptance, or 'stopped')."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        await self.query_one(Markdown).update(self.text)
        self.set_note(note)

    def set_note(self, note: str) -> None:
        """The muted line under the message ("" hides it)."""
        self.note = note
        label = self.query_one(".note", Label)
        label.update(note)
        label.display = bool(note)

    def show_provenance(self, on: bool) -> None:
        self.provenance = on
        static = self.query_one(".provenance", Static)
        if on:
            static.update(self._coloured())
        static.display = on
        self.query_one(Markdown).display = not on

    def _coloured(self) -> Text:
        text, start = Text(), 0
        if self.role != "assistant" or not self.runs:
            return Text(self.text)
        for size, drafted in self.runs:
            text.append(self.text[start:start + size], style=DRAFTED_STYLE if drafted else TARGET_STYLE)
            start += size
        text.append(self.text[start:])  # text without provenance (e.g. typed or from an older save)
        return text
