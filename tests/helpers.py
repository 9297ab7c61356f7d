"""What many test files share: one greedy generation, as token ids, text or events.

    greedy(engine, "The quick brown fox", 48)                       token ids, from an empty cache, past EOS
    greedy(engine, prompt, 64, temperature=0.8, seed=7)              generation options go to the call
    greedy(checkpoint, prompt, 24, drafter="ngram", weights="int8")  a path is loaded with the load options
    greedy(engine, [{"role": "user", "content": "hi"}], 40)          chat messages run through the chat template
    greedy_text(...), greedy_events(...)                             the reply's text, or its events
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Sequence

from edge import Engine
from edge.engine.options import GenerationOptions
from edge.events import Event

PROMPT = "The quick brown fox"
GENERATION_OPTIONS = frozenset(field.name for field in dataclasses.fields(GenerationOptions))
LOAD_DEFAULTS = {"max_context": 256}


def greedy_events(model: Engine | str | Path, prompt: str | Sequence[int] | Sequence[dict] = PROMPT,
                  max_new_tokens: int = 48, *, reset: bool = True, **options) -> list[Event]:
    """The events of one generation, greedy and past end-of-sequence unless `options` say otherwise (temperature,
    seed, ignore_eos=False...). `model` is an Engine (every option goes to the call) or what Engine.load reads (the
    options that are not generation options load it: drafter, weights, kv_cache, max_context (default 256)...).
    `reset` (default) empties the engine's cache first, so a call does not depend on the one before."""
    if isinstance(model, Engine):
        engine, generation = model, options
    else:
        generation = {name: value for name, value in options.items() if name in GENERATION_OPTIONS}
        loading = {name: value for name, value in options.items() if name not in GENERATION_OPTIONS}
        engine = Engine.load(model, **{**LOAD_DEFAULTS, **loading})
    if reset:
        engine.reset()
    chat = bool(prompt) and isinstance(prompt[0], dict)
    run = engine.chat if chat else engine.generate
    return list(run(prompt, max_new_tokens=max_new_tokens, **{"ignore_eos": True, "temperature": 0.0, **generation}))


def greedy(model: Engine | str | Path, prompt: str | Sequence[int] | Sequence[dict] = PROMPT,
           max_new_tokens: int = 48, **options) -> list[int]:
    """The token ids of `greedy_events` (the prompt's not included)."""
    return [token for event in greedy_events(model, prompt, max_new_tokens, **options) for token in event.token_ids]


def greedy_text(model: Engine | str | Path, prompt: str | Sequence[int] | Sequence[dict] = PROMPT,
                max_new_tokens: int = 48, **options) -> str:
    """The text of `greedy_events`, as a front end shows it."""
    return "".join(event.text for event in greedy_events(model, prompt, max_new_tokens, **options))


def sigint_as_from_a_terminal() -> None:
    """preexec_fn of a child a test stops with SIGINT: a shell's background job (CI started with `&`) hands its
    children SIGINT ignored, where a user's Ctrl+C reaches a program with the default handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
