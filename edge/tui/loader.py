"""Load what the chat needs, reporting each stage: the engine (tokenizer, weights, KV cache, drafter; a CPU kernel
build, should one be needed, shows its progress here). The baseline the speedup is shown against is measured later,
once the chat is up and nothing else of edge's runs (ChatSession.measure_baseline)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from textual.highlight import highlight

from edge.engine import Engine
from edge.kernels import cpu_paths
from edge.load_spec import LoadSpec
from edge.sources.model_source import display_name
from edge.tui.history import ConversationStore
from edge.tui.session import ChatSession
from edge.tui.settings import ChatSettings

Progress = Callable[[str, float], None]
WARM_LANGUAGES = ("python", "bash", "json")  # code-block lexers compiled here, not on the UI thread mid-reply


class SessionLoader:
    def __init__(self, model: "LoadSpec | str | Path", settings: ChatSettings, store: ConversationStore, *,
                 measure_baseline: bool = True, special_tokens_in_messages: bool = False, **load_options) -> None:
        """`model`: a load spec, or a checkpoint folder with Engine.load's keyword options. The settings' drafter
        and draft length replace the spec's when loading (ChatSettings.applied_to). `special_tokens_in_messages`:
        as ChatSession takes it."""
        self.spec = model if isinstance(model, LoadSpec) else LoadSpec.from_options(model, **load_options)
        self.settings, self.store, self.measure_baseline = settings, store, measure_baseline
        self.special_tokens_in_messages = special_tokens_in_messages

    @property
    def name(self) -> str:
        return display_name(self.spec.path)

    def load(self, progress: Progress) -> ChatSession:
        shown = [0.0]

        def stage(text: str, fraction: float) -> None:
            shown[0] = 0.8 * fraction
            progress(text, shown[0])

        with cpu_paths.notices(lambda line: progress(line.removeprefix("edge: "), shown[0])):
            engine = Engine.from_spec(self.settings.applied_to(self.spec), progress=stage)
        settings = self.settings
        if engine.plan is not None:  # the plan may have stepped the drafter down
            drafter = engine.spec.drafter
            settings = settings.replace(drafter=str(drafter) if drafter is not None else "none",
                                        memory_budget=str(self.spec.memory_budget))
        session = ChatSession(engine, settings, self.store, model_name=self.name, drafter_spec=settings.drafter,
                              special_tokens_in_messages=self.special_tokens_in_messages)
        session.plan_steps = list(engine.plan.steps) if engine.plan is not None else []
        session.apply(session.settings)  # checks the settings and the memory budget
        session.baseline_pending = self.measure_baseline
        progress("preparing the Markdown view", 0.95)
        for language in WARM_LANGUAGES:
            highlight("x = 1", language=language)
        progress("ready", 1.0)
        return session
