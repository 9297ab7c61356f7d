"""The chat behind the app and the console chat, without any UI: a conversation, the engine that answers it, and
where it is saved.

The app calls `begin` / `regenerate` on its own thread and iterates `stream` in a worker thread; nothing else
touches the conversation while a reply streams. The console chat (edge/tui/cli.py) does both on its one thread. A stopped
reply (the stop flag, or Ctrl+C in the console) is kept as far as it got; a failed one is removed together with its
user message (which the app puts back into the input), so the saved chat is always consistent.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from edge import activity
from edge.decoding.sampling import label
from edge.engine import Engine, GenerationOptions
from edge.errors import EdgeError, MemoryBudgetError
from edge.events import FINISH_STOPPED, Event
from edge.tui.completion import reply_events
from edge.tui.history import Conversation, ConversationStore, title_from
from edge.tui.provenance import extend_runs, provenance_pieces
from edge.memory.budget import format_size
from edge.tui.settings import ChatSettings

BASELINE_PROMPT = "Write a Python function that returns the sum of a list of numbers."
QUIET_POLL_S = 2.0  # how often the baseline looks again whether other edge work has finished


@dataclass
class ReplyOutcome:
    text: str
    finish_reason: str
    event: Event | None  # the last event (its stats), None if nothing was generated


class ChatSession:
    def __init__(self, engine: Engine, settings: ChatSettings, store: ConversationStore | None, *,
                 model_name: str = "", drafter_spec: str | None = None, options: GenerationOptions | None = None,
                 raw: bool = False, special_tokens_in_messages: bool = False) -> None:
        """`store`: where each reply is saved (None: nowhere). `options`: the replies' generation options, instead
        of the settings' (the console chat's come whole from its command line). `raw`: each message is continued as
        text on its own, without the chat template or the earlier turns (edge-chat --raw).
        `special_tokens_in_messages`: special-token strings typed in a message become control tokens (default:
        text; edge-chat --special-tokens-in-messages)."""
        self.engine, self.settings, self.store, self.model_name = engine, settings, store, model_name
        self.drafter_spec = drafter_spec or "none"  # what the engine is loaded with
        self.options, self.raw = options, raw
        self.special_tokens_in_messages = special_tokens_in_messages
        self.conversation = Conversation(model=model_name, system=settings.system_prompt)
        self.outcome: ReplyOutcome | None = None  # how the last reply ended
        self.baseline_tokens_per_s: float | None = None
        self.baseline_pending = False  # a baseline is wanted and not measured yet (the panel says "measuring")
        self._engine_lock = threading.Lock()  # one of a reply, the baseline or a settings change uses the engine
        self.plan_steps: list[str] = []  # what the memory plan gave up to fit the budget, shown in the chat
        self.dropped_turns = 0  # oldest messages left out of the last reply's prompt because the context is full
        # why the chat cannot be saved (one line), None while it can: checked now, then at every save; until a
        # save works the chat lives in memory, and each reply tries again
        self.save_problem: str | None = store.problem() if store is not None else None

    # -- conversation ----------------------------------------------------------------------------------------

    def begin(self, text: str) -> None:
        """Add the user's message; the reply comes from `stream`."""
        if not self.conversation.messages:
            self.conversation.title = title_from(text)
        self.conversation.messages.append({"role": "user", "content": text})

    def regenerate(self) -> str | None:
        """Drop the last reply so `stream` answers the last user message again; its text, or None if none."""
        messages = self.conversation.messages
        if not messages:
            return None
        if messages[-1]["role"] == "assistant":
            messages.pop()
        return messages[-1]["content"] if messages and messages[-1]["role"] == "user" else None

    def new_chat(self) -> None:
        self.conversation = Conversation(model=self.model_name, system=self.settings.system_prompt)

    def open(self, path: Path) -> None:
        """Continue a saved chat (raises ValueError with a readable message if the file is damaged)."""
        self.conversation = self.store.load(path)

    def last_reply(self) -> str | None:
        replies = [m["content"] for m in self.conversation.messages if m["role"] == "assistant"]
        return replies[-1] if replies else None

    def save(self) -> bool:
        """Save the chat; False when that failed (`save_problem` says why; the chat stays in memory, and the next
        save tries again)."""
        if self.store is None:
            return True
        try:
            self.store.save(self.conversation)
        except (OSError, ValueError) as error:  # an unwritable folder, a full disk; an id no file can have
            self.save_problem = self.store.describe(error) if isinstance(error, OSError) else \
                f"cannot save this chat: {error}; it is kept in memory"
            return False
        self.save_problem = None
        return True

    # -- generation (worker thread) --------------------------------------------------------------------------

    def stream(self, stop: threading.Event | None = None) -> Iterator[Event]:
        """Yield the reply's events, until it ends or `stop` is set; record the reply and save when it ends. An
        EdgeError drops the turn; Ctrl+C (KeyboardInterrupt, raised here or thrown in at a yield) keeps the reply as
        far as it got, as stopped."""
        with self._engine_lock:
            yield from self._stream(stop)

    def _stream(self, stop: threading.Event | None) -> Iterator[Event]:
        text, runs, last = [], [], None
        try:
            for event in self._reply_events(stop):
                yield event
                text.append(event.text)  # once taken: an event Ctrl+C cut off at the yield is not part of the reply
                extend_runs(runs, provenance_pieces(event))
                last = event
        except EdgeError:
            self.conversation.messages.pop()  # the user's message goes back to the input; nothing half-recorded
            raise
        except KeyboardInterrupt:
            self._record("".join(text), runs, last, last.finish_reason if last is not None and last.finished
                         else FINISH_STOPPED)
            raise
        self._record("".join(text), runs, last, last.finish_reason if last is not None else FINISH_STOPPED)

    def generation_options(self) -> GenerationOptions:
        return self.options if self.options is not None else self.settings.generation_options()

    def _reply_events(self, stop: threading.Event | None) -> Iterator[Event]:
        options = self.generation_options()
        if stop is not None:
            options = dataclasses.replace(options, should_stop=stop.is_set)
        if self.raw:
            self.dropped_turns = 0
            return self.engine.generate(self.conversation.messages[-1]["content"], options)
        events, self.dropped_turns = reply_events(self.engine, self.conversation.chat_messages(),
                                                  min(options.max_new_tokens, 256), options,
                                                  special_tokens_in_messages=self.special_tokens_in_messages)
        return events

    def _record(self, text: str, runs: list[list[int]], last: Event | None, finish: str) -> None:
        """The reply joins the conversation, which is saved."""
        reply = {"role": "assistant", "content": text, "finish_reason": finish, "provenance": runs}
        if last is not None:
            reply["stats"] = summarise(last, self.drafter_spec)
        self.conversation.messages.append(reply)
        self.outcome = ReplyOutcome(text, finish, last)
        self.save()

    # -- settings ----------------------------------------------------------------------------------------------

    def apply(self, settings: ChatSettings) -> list[str]:
        """Switch to new settings without reloading the model; return what changed, for the status line.

        Raises an EdgeError (one line, naming the fix) and keeps the old settings if one is wrong."""
        with self._engine_lock:
            return self._apply(settings)

    def _apply(self, settings: ChatSettings) -> list[str]:
        settings.check()
        self._check_budget(settings)
        changed = []
        if settings.drafter != self.drafter_spec:
            self.engine.use_drafter(settings.drafter, settings.draft_length)
            self.drafter_spec = settings.drafter
            self.engine.plan = None  # the plan described the old drafter; the memory bar now counts real tensors
            changed.append(f"drafter {settings.drafter}")
        elif settings.draft_length != self.settings.draft_length and self.engine.drafter is not None:
            self.engine.use_drafter(self.engine.drafter, settings.draft_length)
            changed.append(f"draft length {settings.draft_length}")
        if settings.system_prompt != self.settings.system_prompt:
            self.conversation.system = settings.system_prompt
            changed.append("system prompt")
        for name, value in settings.options.options().items():
            if value != getattr(self.settings.options, name):
                changed.append(f"{label(name)} {value or 'off'}")
        if settings.memory_budget != self.settings.memory_budget:
            changed.append(f"memory budget {settings.memory_budget or 'off'}")
        self.settings = settings
        return changed

    def _check_budget(self, settings: ChatSettings) -> None:
        """The model, its KV cache and the current drafter must fit the budget (the planner refines this)."""
        budget = settings.budget_bytes
        needed = self.engine.memory_footprint()["total"]
        if budget is not None and needed > budget:
            raise MemoryBudgetError(f"the memory budget {settings.memory_budget} is too small: the model, its KV cache "
                                    f"and drafter need {format_size(needed)}; raise the budget to at least that")

    def measure_baseline(self, tokens: int = 64, stop: threading.Event | None = None) -> float | None:
        """Plain (autoregressive) decoding speed on this machine, the reference for the speedup shown: a chat reply
        like the ones the panel measures, decoded the same way without the drafter. A base model (no chat template)
        continues the prompt as text.

        Measured only when nothing else of edge's runs: it first waits while other edge work is busy on this
        machine (a kernel build, another edge command decoding: edge/activity.py), then for this chat's own reply to
        end. None, unmeasured, if `stop` is set while it waits."""
        while activity.other_edge_work():
            if stop is None:
                time.sleep(QUIET_POLL_S)
            elif stop.wait(QUIET_POLL_S):
                return None
        with self._engine_lock:
            last = None
            options = GenerationOptions(max_new_tokens=tokens, ignore_eos=True, speculate=False)
            events, _ = reply_events(self.engine, [{"role": "user", "content": BASELINE_PROMPT}], 1, options)
            for last in events:
                pass
            self.engine.reset()
        self.baseline_tokens_per_s = last.stats.tokens_per_s if last is not None else None
        self.baseline_pending = False
        return self.baseline_tokens_per_s or 0.0


def summarise(event: Event, drafter: str) -> dict:
    stats = event.stats
    return {"tokens": stats.generated_tokens, "tokens_per_s": round(stats.tokens_per_s, 2),
            "mean_accepted_tokens": round(stats.mean_accepted_tokens, 3),
            "acceptance_rate": round(stats.acceptance_rate, 4), "drafter": drafter, "at": time.time()}

