"""Settings: drafter (one of the list, or a draft model named as on the command line), draft length, the generation
options (a field for each number SamplingParams declares, labelled as its flag; stop strings stay as the command line
set them) with the repetition guard they make in words, memory budget and system prompt, applied in place."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea

from edge.errors import EdgeError
from edge.decoding.sampling import OPTIONS, label
from edge.decoding.sampling import SamplingParams
from edge.tui.settings import DRAFTER_CHOICES, FORM_OPTIONS, ChatSettings, form_text, form_value, repetition_guard


class SettingsScreen(ModalScreen[ChatSettings | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "apply", "Apply")]

    def __init__(self, settings: ChatSettings, drafters: list[tuple[str, str]] | None = None) -> None:
        super().__init__()
        self.settings = settings
        choices = list(drafters or DRAFTER_CHOICES)
        if settings.drafter not in {value for _, value in choices}:
            choices.insert(0, (settings.drafter, settings.drafter))
        self.drafters = choices

    def compose(self) -> ComposeResult:
        s = self.settings
        with VerticalScroll(id="settings-box"):
            yield Label("Settings", id="settings-title")
            with Grid(id="settings-grid"):
                yield Label("drafter")
                yield Select(self.drafters, value=s.drafter, allow_blank=False, id="drafter", compact=True)
                yield Label("draft model")
                yield Input("", placeholder="a folder, .gguf file or org/name:Q4_K_M", id="draft_model", compact=True)
                yield Label("draft length")
                yield Input(s.draft_length, placeholder="adaptive or a number", id="draft_length", compact=True)
                yield Label("memory budget")
                yield Input(s.memory_budget, placeholder="e.g. 6GiB (empty: none)", id="memory_budget", compact=True)
            with Grid(id="options-grid"):
                for name in FORM_OPTIONS:
                    yield Label(label(name))
                    yield Input(form_text(getattr(s.options, name)), placeholder=OPTIONS[name].note, id=name,
                                tooltip=OPTIONS[name].usage(), compact=True)
            yield Label(repetition_guard(s.options), id="repetition-guard")
            yield Label("system prompt")
            yield TextArea(s.system_prompt, id="system_prompt", soft_wrap=True, compact=True)
            yield Label("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Apply (Ctrl+S)", variant="primary", id="apply", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)

    def read(self) -> ChatSettings:
        """The form as settings; raises a one-line error naming the field that is wrong."""
        value = lambda name: self.query_one(f"#{name}", Input).value  # noqa: E731
        draft_model = value("draft_model").strip()
        return self.settings.replace(
            drafter=f"draft:{draft_model}" if draft_model else str(self.query_one("#drafter", Select).value),
            draft_length=value("draft_length").strip() or "adaptive",
            options=self.form_options(),
            memory_budget=value("memory_budget").strip(),
            system_prompt=self.query_one("#system_prompt", TextArea).text.strip(),
        ).check()

    def form_options(self) -> SamplingParams:
        """The generation option fields as options; a SamplingError names a field that is wrong."""
        values = {name: form_value(name, self.query_one(f"#{name}", Input).value) for name in FORM_OPTIONS}
        return self.settings.replace(**values).options

    def on_input_changed(self, event: Input.Changed) -> None:
        """A generation option changed: the repetition guard line says what the fields now make."""
        if event.input.id in FORM_OPTIONS:
            try:
                guard = repetition_guard(self.form_options())
            except EdgeError:
                guard = "repetition guard: (a field above is not valid yet)"
            self.query_one("#repetition-guard", Label).update(guard)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_apply() if event.button.id == "apply" else self.action_cancel()

    def action_apply(self) -> None:
        try:
            settings = self.read()
        except EdgeError as error:
            self.query_one("#settings-error", Label).update(str(error))
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)
