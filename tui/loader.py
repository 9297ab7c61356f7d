"""Load what the chat needs, reporting each stage: the engine (tokenizer, weights, KV cache, drafter), then a
short plain-decoding run that measures the baseline the speedup is shown against."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edge.engine import DEFAULT_MAX_CONTEXT, Engine
from tui.history import ConversationStore
from tui.session import ChatSession
from tui.settings import ChatSettings

Progress = Callable[[str, float], None]


@dataclass
class SessionLoader:
    model_path: Path
    settings: ChatSettings
    store: ConversationStore
    dtype: str = "float32"
    device: str = "cpu"
    max_context: int = DEFAULT_MAX_CONTEXT
    measure_baseline: bool = True
    memory_budget: str | None = None  # plan for this budget (the plan's step-downs are shown in the chat)
    backend: str | None = None  # for a bundle: onnx, torchscript or torch-export (default: its first)
    draft_context: int | None = None  # a draft model's own cache length (default: the context)
    draft_weights: str | None = None  # "bfloat16", "int8" or "int4": store a draft model's weights narrower
    kv_cache: str | None = None  # a quantized KV cache format (int8, int8-int4, hierarchical)
    draft_kv: str | None = None  # a draft model's own cache format (int8, int8-int4)
    weights: str | None = None  # "int8" or "int4": quantize the target's layers at load (edge/packed_weights.py)

    @property
    def name(self) -> str:
        return self.model_path.name

    def load(self, progress: Progress) -> ChatSession:
        drafter = None if self.settings.drafter == "none" else self.settings.drafter
        engine = Engine.load(self.model_path, dtype=self.dtype, device=self.device, max_context=self.max_context,
                             drafter=drafter, draft_length=self.settings.draft_length,
                             progress=lambda stage, fraction: progress(stage, 0.8 * fraction),
                             memory_budget=self.memory_budget, backend=self.backend,
                             draft_context=self.draft_context, draft_weights=self.draft_weights,
                             kv_cache=self.kv_cache, draft_kv=self.draft_kv, weights=self.weights)
        settings = self.settings
        if engine.plan is not None:  # the plan may have stepped the drafter down
            from edge.planning import planned_drafter

            drafter = planned_drafter(drafter, engine.plan)
            settings = settings.replace(drafter=drafter or "none", memory_budget=str(self.memory_budget))
        session = ChatSession(engine, settings, self.store, model_name=self.name, drafter_spec=drafter)
        session.plan_steps = list(engine.plan.steps) if engine.plan is not None else []
        session.apply(session.settings)  # checks the settings and the memory budget
        if self.measure_baseline:
            progress("measuring plain decoding speed (the speedup's reference)", 0.85)
            session.measure_baseline()
        progress("ready", 1.0)
        return session
