"""edge-chat: chat with a model in the terminal, streaming the reply as it is generated.

    edge-chat [MODEL]                    the chat app (Textual); the default model (SmolLM2-135M-Instruct) when
                                         MODEL is omitted
    edge-chat [MODEL] --prompt "..."     print one reply and exit (also reads the prompt from a pipe)
    edge-chat [MODEL] --plain            a line-by-line console chat (/reset, /quit; Ctrl+C stops a reply), saved
                                         like the app's; piped in, one message per line
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import sys
import threading
import time
from typing import Iterable, Iterator, TextIO

from edge.sources import default_model
from edge.frontend.options import (
    add_model_arguments,
    add_sampling_arguments,
    add_speculation_arguments,
    add_threads_argument,
    command_spec,
    default_drafter,
    generation_options,
    load_spec,
    model_options,
)
from edge.engine import Engine, GenerationOptions
from edge.errors import EdgeError
from edge.events import FINISH_CONTEXT, FINISH_LOOP, Event
from edge.load_spec import LoadSpec
from edge.tui.app import EdgeChatApp
from edge.tui.completion import completion_note, is_completion_model
from edge.tui.history import Conversation, ConversationStore
from edge.tui.loader import SessionLoader
from edge.tui.session import ChatSession
from edge.tui.settings import CHAT_MAX_NEW_TOKENS, DRAFTER_CHOICES, ChatSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-chat",
        description="Chat with a local model. Streams the reply token by token; multi-turn chats reuse the KV "
        "cache so only the new turn is prefilled.",
    )
    add_model_arguments(parser)
    add_threads_argument(parser)
    parser.add_argument("--prompt", help="send this one message, print the reply and exit")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--raw", action="store_true", help="continue the text as is, without the chat template "
                        "(console output, not the app)")
    parser.add_argument("--special-tokens-in-messages", action="store_true",
                        help="let special-token strings typed in a message (<|im_end|>, ...) act as the model's "
                             "control tokens; by default they are plain text, so a message cannot forge a turn")
    parser.add_argument("--stats", action="store_true",
                        help="after each reply (--prompt and --plain) print the load time, the time to the first "
                             "token, decode tokens/s, tokens per step, acceptance and, with a drafter, the speedup "
                             "over plain decoding (measured once after loading unless --no-baseline)")
    parser.add_argument("--plain", action="store_true", help="line-by-line console chat instead of the app; with "
                        "text piped in, one message per line (/reset, /quit); saved like the app's chats")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the short plain-decoding run at start that the app's speedup figure (and --stats') "
                             "compares to")
    add_speculation_arguments(parser)
    add_sampling_arguments(parser, max_new_tokens=CHAT_MAX_NEW_TOKENS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        generation_options(args)  # the sampling flags first: a bad one is reported before anything loads
        spec = command_spec(args)
        if spec is None:  # --plan
            return 0
        options = model_options(args, spec)  # the flags over the model's recommended sampling
    except EdgeError as error:
        print(f"edge-chat: error: {error}", file=sys.stderr)
        return 2
    if args.prompt is None and not (args.plain or args.raw) and sys.stdin.isatty() and sys.stdout.isatty():
        return run_app(args, spec)
    try:
        started = time.perf_counter()
        engine = Engine.from_spec(spec)
        load_s = time.perf_counter() - started
        for step in engine.plan.steps if engine.plan else ():
            print(f"edge-chat: memory plan: {step}", file=sys.stderr)
        piped = not sys.stdin.isatty()
        if piped and hasattr(sys.stdin, "reconfigure"):  # undecodable bytes reach the engine's one-line PromptError
            sys.stdin.reconfigure(errors="surrogateescape")
        if args.prompt is None and piped and not args.plain:
            args.prompt = sys.stdin.read().strip()  # text piped in without --plain: one message
        chat = ConsoleChat(engine, options, system=args.system, raw=args.raw, show_stats=args.stats,
                           special_tokens_in_messages=args.special_tokens_in_messages,
                           model_name=args.model or spec.path.name,
                           store=ConversationStore() if args.prompt is None else None, load_s=load_s)
        if args.stats and chat.speculates and not args.no_baseline:
            print("edge-chat: measuring plain decoding for --stats' speedup (--no-baseline skips it)",
                  file=sys.stderr)
            measure_console_baseline(chat)
        if args.prompt is not None:
            chat.reply(args.prompt, sys.stdout)
        else:
            chat.interactive(sys.stdin if piped else None)
    except EdgeError as error:
        print(f"edge-chat: error: {error}", file=sys.stderr)
        return 2
    return 0


def run_app(args: argparse.Namespace, spec: LoadSpec) -> int:
    """The Textual chat app; loading errors are shown in the app, bad options here as one line."""
    app = chat_app(args, spec)
    app.run()
    if app.load_error:
        print(f"edge-chat: error: {app.load_error}", file=sys.stderr)
    return app.return_code or 0


def chat_app(args: argparse.Namespace, spec: LoadSpec) -> EdgeChatApp:
    """The app edge-chat runs for these options (docs/screenshots/take.py runs the same one headless)."""
    builtin = args.model is None and default_model.packaged_file() is None  # the built-in model: its drafters fit

    def offered(drafter: str) -> bool:  # the built-in drafters fit the built-in model only; no datastore ships for it
        return builtin if "builtin" in drafter else not builtin if drafter == "retrieval" else True

    return EdgeChatApp(app_loader(args, spec), drafters=[choice for choice in DRAFTER_CHOICES if offered(choice[1])])


BASELINE_WAIT_S = 10.0  # how long --stats waits for other edge work to end before it leaves the speedup out


def measure_console_baseline(chat: "ConsoleChat", wait_s: float | None = None) -> None:
    """--stats' plain-decoding baseline, measured when no other edge work runs (ChatSession.measure_baseline); past
    `wait_s` (default BASELINE_WAIT_S) of waiting for that, the speedup is left out and the stats say why."""
    wait_s = BASELINE_WAIT_S if wait_s is None else wait_s
    stop = threading.Event()
    timer = threading.Timer(wait_s, stop.set)
    timer.start()
    try:
        if chat.session.measure_baseline(stop=stop) is None:
            chat.baseline_note = "other edge work kept the machine busy"
            print(f"edge-chat: plain decoding not measured: other edge work ran for {wait_s:.0f} s", file=sys.stderr)
    finally:
        timer.cancel()


def app_loader(args: argparse.Namespace, spec: LoadSpec) -> SessionLoader:
    """What the app loads: the command line's load spec and the chat settings that go with it."""
    return SessionLoader(spec, app_settings(args, spec), ConversationStore(), measure_baseline=not args.no_baseline,
                         special_tokens_in_messages=args.special_tokens_in_messages)


def app_settings(args: argparse.Namespace, spec: LoadSpec | None = None) -> ChatSettings:
    """The app's starting settings: the drafter and draft length of the load spec, and every sampling option of the
    command line."""
    spec = spec or load_spec(args, default_drafter(args))
    return ChatSettings.from_spec(spec, model_options(args, spec), system_prompt=args.system or "")


class ConsoleChat:
    """The console chat (--prompt, --plain, or text piped in): one conversation (a ChatSession), saved after each
    reply when a store is given, like the app's; each reply written to `out` as it streams."""

    def __init__(self, engine: Engine, options: GenerationOptions, *, system: str | None = None,
                 raw: bool = False, show_stats: bool = False, model_name: str = "",
                 store: ConversationStore | None = None, load_s: float | None = None,
                 special_tokens_in_messages: bool = False) -> None:
        """`load_s`: how long the engine took to load, shown with the first reply's stats."""
        self.show_stats, self.load_s = show_stats, load_s
        self.baseline_note = "--no-baseline"  # why a speedup is missing from the stats
        drafter = engine.spec.drafter if engine.spec is not None else None
        # the settings carry the system prompt; the options, whole from the command line, replace their sampling
        self.session = ChatSession(engine, ChatSettings(system_prompt=system or ""), store, model_name=model_name,
                                   drafter_spec=str(drafter) if drafter is not None else None, options=options,
                                   raw=raw, special_tokens_in_messages=special_tokens_in_messages)
        if is_completion_model(engine) and not raw:
            print(f"edge-chat: {completion_note(model_name)}", file=sys.stderr)
        self.reported_save_problem: str | None = None
        self.report_saving()

    def report_saving(self) -> None:
        """One line on stderr when the chat cannot be saved (at start, or when a save first fails), and one when
        saving works again; nothing while that stays the same."""
        problem = self.session.save_problem
        if problem is not None and problem != self.reported_save_problem:
            print(f"edge-chat: {problem}", file=sys.stderr)
        elif problem is None and self.reported_save_problem is not None:
            print(f"edge-chat: the chat is saved again ({self.session.store.path(self.conversation.id)})",
                  file=sys.stderr)
        self.reported_save_problem = problem

    @property
    def engine(self) -> Engine:
        return self.session.engine

    @property
    def speculates(self) -> bool:
        """Whether replies draft (a drafter is loaded and the options let it): then a speedup can be measured."""
        return self.engine.drafter is not None and self.session.generation_options().speculate

    @property
    def conversation(self) -> Conversation:
        return self.session.conversation

    def reset(self) -> None:
        self.session.new_chat()

    def reply(self, text: str, out: TextIO) -> str:
        """Send one user message, stream the reply to `out`, and record both in the conversation."""
        self.session.begin(text)
        turn = self.session.stream()
        sent, first_token_s = time.perf_counter(), None
        try:
            for index, event in enumerate(turn):
                if first_token_s is None and event.token_ids:
                    first_token_s = time.perf_counter() - sent
                if index == 0 and self.session.dropped_turns:
                    print(f"(context full: the oldest {self.session.dropped_turns} messages are left out)",
                          file=sys.stderr)
                out.write(event.text)
                out.flush()
        except KeyboardInterrupt:
            if inspect.getgeneratorstate(turn) == inspect.GEN_SUSPENDED:  # Ctrl+C here, not in the generation:
                with contextlib.suppress(KeyboardInterrupt):  # the turn ends at its yield, keeping the reply
                    turn.throw(KeyboardInterrupt())
            out.write(" [stopped]")
        out.write("\n")
        self.report_saving()
        outcome = self.session.outcome
        if outcome.finish_reason == FINISH_CONTEXT:
            print(f"edge-chat: the reply was cut: the context ({self.engine.max_context} tokens) is full; /reset "
                  "starts over, or load with a longer --max-context", file=sys.stderr)
        if outcome.finish_reason == FINISH_LOOP:
            print("edge-chat: the reply was stopped: it kept repeating itself (--loop-stop 0 turns the loop stop "
                  "off)", file=sys.stderr)
        if self.show_stats and outcome.event is not None:
            out.write(stats_line(outcome.event, load_s=self.load_s, first_token_s=first_token_s,
                                 baseline_tokens_per_s=self.session.baseline_tokens_per_s if self.speculates else None,
                                 speculates=self.speculates, baseline_note=self.baseline_note))
            self.load_s = None  # said once
        return outcome.text

    def interactive(self, lines: Iterable[str] | None = None) -> None:
        """Chat line by line: typed at a prompt, or `lines` (text piped in: one message per line, no prompts).
        /reset starts over, /quit (or the end of input) leaves."""
        if lines is None:
            print("edge-chat: type a message; /reset starts over, /quit or Ctrl+D leaves, Ctrl+C stops a reply.")
        for line in lines if lines is not None else _typed_lines():
            line = line.strip()
            if line in ("/quit", "/exit"):
                return
            if line == "/reset":
                self.reset()
                print("(new chat)")
            elif line:
                try:
                    self.reply(line, sys.stdout)
                except EdgeError as error:
                    print(f"error: {error}", file=sys.stderr if lines is not None else sys.stdout)


def stats_line(last: Event, *, load_s: float | None = None, first_token_s: float | None = None,
               baseline_tokens_per_s: float | None = None, speculates: bool = False,
               baseline_note: str = "--no-baseline") -> str:
    """--stats after a reply: load time (`load_s`, when given), time to the first token, decode speed, tokens per
    step, acceptance and the speedup over the measured plain-decoding speed (where one was measured)."""
    stats = last.stats
    parts = [f"load {load_s:.2f} s"] if load_s is not None else []
    if first_token_s is not None:
        parts.append(f"first token {first_token_s:.2f} s")
    parts.append(f"{stats.generated_tokens} tokens, {stats.tokens_per_s:.1f} tokens/s decoding")
    parts.append(f"{stats.mean_accepted_tokens:.2f} tokens/step")
    if not speculates:
        parts.append("plain decoding (no drafter)")
    else:
        parts.append(f"{stats.acceptance_rate:.0%} of {stats.drafted} drafted accepted")
        if baseline_tokens_per_s and stats.decode_s:
            parts.append(f"speedup {stats.tokens_per_s / baseline_tokens_per_s:.2f}x over plain decoding "
                         f"({baseline_tokens_per_s:.1f} tokens/s)")
        else:
            parts.append(f"speedup not measured ({baseline_note})")
    parts.append(f"prefill {stats.prefill_tokens} tokens, reused {stats.reused_tokens}, {last.finish_reason}")
    return f"[{', '.join(parts)}]\n"


def _typed_lines() -> Iterator[str]:
    """Lines typed at the '>>> ' prompt, until Ctrl+D or Ctrl+C at the prompt."""
    while True:
        try:
            yield input(">>> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return


if __name__ == "__main__":
    sys.exit(main())
