"""The chat: messages on the left, live speculation figures and memory on the right, the input at the bottom.

Replies are generated in a thread worker that reaches the UI only through messages (`ReplyChunk`, `ReplyDone`,
`ReplyFailed`), as often as `edge.tui.pacing` allows; Esc or Ctrl+C sets a stop flag the worker checks after every step.
A message sent while a reply streams is queued, shown as such, and sent when the reply ends. Other actions that
change the conversation (regenerate, new chat, open a chat) wait until no reply is streaming, so the chat on screen,
the saved file and the engine's cache always agree.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Label
from textual.worker import get_current_worker

from edge.errors import EdgeError
from edge.events import FINISH_CONTEXT, FINISH_LOOP, Stats
from edge.tui.screens.history import HistoryScreen
from edge.tui.screens.settings import SettingsScreen
from edge.tui.completion import completion_note, is_completion_model
from edge.tui.pacing import UpdatePacer, ui_duty
from edge.tui.provenance import provenance_pieces
from edge.tui.session import FINISH_STOPPED, ChatSession, ReplyOutcome
from edge.tui.settings import ChatSettings
from edge.tui.widgets.message import MessageView, provenance_legend
from edge.tui.widgets.prompt import PromptInput
from edge.tui.widgets.stats import MemoryBar, StatsPanel



QUEUED_NOTE = "queued: sent when this reply ends (Esc stops it now)"
LOOP_NOTE = "stopped: the reply kept repeating itself (the loop stop; F3 settings: loop-stop 0 turns it off)"


@dataclass
class ReplyChunk(Message):
    pieces: list[tuple[str, bool]]  # (text, drafted-and-accepted) in order
    stats: Stats


@dataclass
class ReplyDone(Message):
    outcome: ReplyOutcome


@dataclass
class ReplyFailed(Message):
    error: str
    prompt: str


class ChatScreen(Screen):
    # every key is in the footer (short names; Esc while a reply streams, Ctrl+R while none does, so that they fit 80
    # columns beside the app's Ctrl+Q and Ctrl+P) and in the command palette (EdgeChatApp.get_system_commands, each
    # with its key)
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+c", "stop_or_copy", "Stop", show=False, priority=True),
        Binding("f2", "toggle_provenance", "Colours"),
        Binding("f3", "settings", "Settings"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+o", "open_chat", "Open"),
        Binding("ctrl+r", "regenerate", "Redo"),
        Binding("ctrl+y", "copy_reply", "Copy", priority=True),
    ]

    streaming = reactive(False, bindings=True)  # a reply is streaming; the footer's keys follow it

    def __init__(self, session: ChatSession, *, drafters: list[tuple[str, str]] | None = None,
                 memory_probe=None, runtime_bytes: int | None = None) -> None:
        """`runtime_bytes`: the process's resident memory before the model loaded (the memory panel's verdict)."""
        super().__init__()
        self.session = session
        self.drafters = drafters
        self.memory_probe = memory_probe or resident_bytes
        self.runtime_bytes = runtime_bytes
        self.provenance = False
        self._stop = threading.Event()
        self._reply: MessageView | None = None
        self._queued: list[MessageView] = []  # messages sent while a reply streams, oldest first
        self._drafted_before = self._steps_before = 0
        self.pacer = UpdatePacer(ui_duty(torch.get_num_threads()))  # how often a streaming reply is drawn
        self._reported_save_problem: str | None = None  # the save problem last shown, if any

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Stop is offered while a reply streams, Regenerate while none does (it waits for the reply anyway)."""
        if action == "stop":
            return self.streaming
        if action == "regenerate":
            return not self.streaming
        return True

    # -- layout --------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield VerticalScroll(id="messages")
                yield Label(provenance_legend(), id="legend")
                yield PromptInput(id="prompt", placeholder="Message · Enter sends · Ctrl+J new line")
            with Vertical(id="side"):
                yield StatsPanel(id="stats")
                yield MemoryBar(id="memory")
                yield Label("", id="status")
        yield Footer(compact=True)  # every key fits 80 columns

    async def on_mount(self) -> None:
        self.title = "edge-chat"
        self.sub_title = self.session.model_name
        self.query_one(StatsPanel).show(drafter=self.session.drafter_spec,
                                        draft_length=self.session.settings.draft_length,
                                        baseline_tokens_per_s=self.session.baseline_tokens_per_s,
                                        measuring=self.session.baseline_pending)
        if self.session.baseline_pending:
            self.measure_baseline()
        self.refresh_memory()
        await self.show_conversation()
        self.query_one(PromptInput).focus()
        if is_completion_model(self.session.engine):
            self.set_status("completion model (no chat template): each message continues the text")
            self.notify(completion_note(self.session.model_name), title="a base model", timeout=10)
        if self.session.plan_steps:
            self.set_status("memory plan: " + "; ".join(self.session.plan_steps))
            self.notify("\n".join(self.session.plan_steps), title="to fit the memory budget", timeout=10)
        self.report_saving()

    def report_saving(self) -> None:
        """A warning when the chat cannot be saved (at start, or when a save first fails); nothing while that stays
        the same. The chat goes on in memory, and each reply's save tries again."""
        problem = self.session.save_problem
        if problem is not None and problem != self._reported_save_problem:
            self.notify(problem, title="not saved", severity="warning", timeout=10)
        self._reported_save_problem = problem

    async def show_conversation(self) -> None:
        """Rebuild the message list from the session's conversation (after opening or starting a chat)."""
        messages = self.query_one("#messages", VerticalScroll)
        await messages.remove_children()
        views = [MessageView(m["role"], m["content"], m.get("provenance"), note=_note(m))
                 for m in self.session.conversation.messages]
        for view in views:
            view.provenance = self.provenance
        await messages.mount_all(views)
        messages.scroll_end(animate=False)

    def refresh_memory(self) -> None:
        """Plan: the memory plan's footprint (with verify buffers) when there is one, else the engine's tensors."""
        plan = self.session.engine.plan
        planned = plan.footprint.total if plan is not None else self.session.engine.memory_footprint()["total"]
        budget = plan.budget if plan is not None else self.session.settings.budget_bytes
        self.query_one(MemoryBar).show(planned, self.memory_probe(), budget, runtime=self.runtime_bytes)

    def set_status(self, text: str) -> None:
        self.query_one("#status", Label).update(text)

    # -- sending and streaming -----------------------------------------------------------------------------

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        message.prompt.remember(message.text)
        if self.streaming:  # shown as queued at once, sent when the reply ends
            view = MessageView("user", message.text, note=QUEUED_NOTE)
            view.add_class("queued")
            self._queued.append(view)
            await self.query_one("#messages").mount(view)
            self.set_status(self._generating_status())
            return
        self.session.begin(message.text)
        await self.query_one("#messages").mount(MessageView("user", message.text))
        await self._start_reply(message.text)

    async def _send_queued(self) -> None:
        """The reply ended: send the oldest queued message (its view is already in place)."""
        view = self._queued.pop(0)
        view.remove_class("queued")
        view.set_note("")
        self.session.begin(view.text)
        await self._start_reply(view.text)

    def _generating_status(self) -> str:
        waiting = f" · {len(self._queued)} queued" if self._queued else ""
        return f"generating… (Esc stops){waiting}"

    async def _start_reply(self, prompt: str) -> None:
        self._reply = MessageView("assistant")
        self._reply.provenance = self.provenance
        messages = self.query_one("#messages", VerticalScroll)
        await messages.mount(self._reply)
        messages.anchor()
        self.streaming, self._drafted_before, self._steps_before = True, 0, 0
        self._stop.clear()
        self.set_status(self._generating_status())
        self.call_after_refresh(self._begin_decoding, prompt)  # the new messages are drawn before decoding starts

    def _begin_decoding(self, prompt: str) -> None:
        self.pacer.start(time.thread_time())
        self.generate(prompt)

    @work(thread=True, group="baseline")
    def measure_baseline(self) -> None:
        """The speedup's reference, measured once nothing else of edge's runs (the panel says "measuring" until
        then); a reply sent meanwhile waits the second or two it takes."""
        if self.session.measure_baseline(stop=get_current_worker().cancelled_event) is not None:
            self.app.call_from_thread(self.query_one(StatsPanel).show, measuring=False,
                                      baseline_tokens_per_s=self.session.baseline_tokens_per_s)

    @work(thread=True, exclusive=True, group="reply")
    def generate(self, prompt: str) -> None:
        pieces = []
        try:
            for event in self.session.stream(self._stop):
                pieces += provenance_pieces(event)
                if event.finished or self.pacer.due():
                    self.pacer.sent()
                    self.post_message(ReplyChunk(pieces, event.stats))
                    pieces = []
        except EdgeError as error:
            self.post_message(ReplyFailed(str(error), prompt))
        else:
            if pieces:  # stopped between updates
                self.post_message(ReplyChunk(pieces, self.session.outcome.event.stats))
            self.post_message(ReplyDone(self.session.outcome))

    async def on_reply_chunk(self, message: ReplyChunk) -> None:
        if self._reply is not None:
            await self._reply.append(message.pieces)
        stats = message.stats
        steps = stats.steps - self._steps_before
        recent_k = round((stats.drafted - self._drafted_before) / steps) if steps else None  # mean k lately
        self.query_one(StatsPanel).show(stats, last_k=recent_k or None)
        self._drafted_before, self._steps_before = stats.drafted, stats.steps
        self.call_after_refresh(lambda: self.pacer.drawn(time.thread_time()))  # measured once it is on screen

    async def on_reply_done(self, message: ReplyDone) -> None:
        self.streaming = False
        if self._reply is not None:
            await self._reply.finish(_note(self.session.conversation.messages[-1]))
        self._reply = None
        self.refresh_memory()
        status = ("stopped" if message.outcome.finish_reason == FINISH_STOPPED else
                  LOOP_NOTE if message.outcome.finish_reason == FINISH_LOOP else "")
        if self.session.dropped_turns:
            status = f"context full: the oldest {self.session.dropped_turns} messages were left out " + status
        self.set_status(status.strip())
        self.report_saving()
        if self._queued:
            await self._send_queued()

    async def on_reply_failed(self, message: ReplyFailed) -> None:
        self.streaming = False
        queued = [view.text for view in self._queued]  # not sent: they go back to the input after the failed one
        for view in self._queued:
            await view.remove()
        self._queued = []
        messages = self.query_one("#messages", VerticalScroll)
        for view in list(messages.query(MessageView))[-2:]:  # the failed reply and its user message
            await view.remove()
        self._reply = None
        self.query_one(PromptInput).load_text("\n\n".join([message.prompt, *queued]))  # nothing is lost
        self.set_status("")
        self.notify(message.error, title="could not reply", severity="error", timeout=10)

    # -- actions -------------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.streaming:
            self._stop.set()

    def action_stop_or_copy(self) -> None:
        prompt = self.query_one(PromptInput)
        if self.streaming:
            self._stop.set()
        elif prompt.selected_text:
            self.app.copy_to_clipboard(prompt.selected_text)
        else:
            self.app.action_help_quit()

    async def action_toggle_provenance(self) -> None:
        self.provenance = not self.provenance
        for view in self.query(MessageView):
            view.show_provenance(self.provenance)
        self.query_one("#legend", Label).display = self.provenance  # above the input, in place of nothing

    def _busy(self) -> bool:
        if self.streaming:
            self.notify("A reply is still streaming: press Esc to stop it first.", severity="warning")
        return self.streaming

    async def action_regenerate(self) -> None:
        if self._busy():
            return
        prompt = self.session.regenerate()
        if prompt is None:
            self.notify("Nothing to regenerate yet.")
            return
        views = list(self.query(MessageView))
        if views and views[-1].role == "assistant":
            await views[-1].remove()
        await self._start_reply(prompt)

    async def action_new_chat(self) -> None:
        if self._busy():
            return
        self.session.new_chat()
        await self.show_conversation()
        self.query_one(StatsPanel).reset_reply()
        self.set_status("new chat")

    def action_copy_reply(self) -> None:
        reply = self.session.last_reply()
        if reply is None:
            self.notify("No reply to copy yet.")
            return
        self.app.copy_to_clipboard(reply)
        self.notify(f"Copied the last reply ({len(reply)} characters).")

    def action_settings(self) -> None:
        self.app.push_screen(SettingsScreen(self.session.settings, self.drafters), self._apply_settings)

    def _apply_settings(self, settings: ChatSettings | None) -> None:
        if settings is None:
            return
        if self._busy():
            return
        try:
            changed = self.session.apply(settings)
        except EdgeError as error:
            self.notify(str(error), title="settings not applied", severity="error", timeout=10)
            return
        self.query_one(StatsPanel).show(drafter=self.session.drafter_spec, draft_length=settings.draft_length)
        self.refresh_memory()
        self.set_status("applied: " + ", ".join(changed) if changed else "no changes")

    def action_open_chat(self) -> None:
        if self._busy():
            return
        self.app.push_screen(HistoryScreen(self.session.store.list()), self._open_chat)

    async def _open_chat(self, path: Path | None) -> None:
        if path is None or self._busy():
            return
        try:
            self.session.open(path)
        except ValueError as error:
            self.notify(str(error), severity="error")
            return
        await self.show_conversation()
        self.query_one(StatsPanel).reset_reply()  # the figures were the last reply's, of another chat
        self.set_status(f"opened: {self.session.conversation.title}")


def resident_bytes() -> int:
    """This process's resident memory."""
    return psutil.Process().memory_info().rss


def _note(message: dict) -> str:
    """The line under a reply: how it was made, or that it was stopped."""
    if message.get("role") != "assistant":
        return ""
    stats, parts = message.get("stats") or {}, []
    if stats:
        parts.append(f"{stats['tokens']} tokens · {stats['tokens_per_s']:.1f} tok/s")
        if stats.get("drafter", "none") != "none":
            parts.append(f"{stats['acceptance_rate']:.0%} accepted · {stats['mean_accepted_tokens']:.2f} tokens/step")
    if message.get("finish_reason") == FINISH_STOPPED:
        parts.append("stopped")
    if message.get("finish_reason") == FINISH_CONTEXT:
        parts.append("cut: the context is full (Ctrl+N starts a new chat; --max-context makes it longer)")
    if message.get("finish_reason") == FINISH_LOOP:
        parts.append(LOOP_NOTE)
    return " · ".join(parts)
