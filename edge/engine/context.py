"""Fitting a chat into the context: the oldest turns are dropped (never the system prompt or the last message) until
the rendered chat and the room its reply needs fit."""

from __future__ import annotations

from typing import Callable, Sequence

from edge.engine.prompts import checked_text, context_fix
from edge.errors import ContextLengthError
from edge.text.chat_template import check_messages
from edge.text.message_text import RenderedChat
from edge.text.tokenizer import Tokenizer


def fit_messages(messages: Sequence[dict], reserve: int, render: Callable[[list[dict]], str | RenderedChat],
                 tokenizer: Tokenizer, max_context: int, model_limit: int) -> tuple[list[dict], int]:
    """The messages to send and how many were dropped: whole turns from the oldest (a user turn with its reply) until
    `render(messages)` (text, or a rendered chat), encoded with `tokenizer`, plus `reserve` tokens fits
    `max_context`. ContextLengthError when even the last message alone does not fit (`model_limit`: the model's own
    limit, for the fix it names)."""
    check_messages(messages)
    messages = list(messages)
    head = [m for m in messages[:1] if m.get("role") == "system"]
    turns = messages[len(head):]
    dropped = 0
    while True:
        rendered = render(head + turns)
        if isinstance(rendered, RenderedChat):
            checked_text(rendered.text, "the chat")
            size = len(tokenizer.encode_rendered(rendered))
        else:
            size = len(tokenizer.encode(checked_text(rendered, "the chat"), add_special_tokens=False))
        if size + reserve <= max_context:
            return head + turns, dropped
        if len(turns) <= 1:
            raise ContextLengthError(f"the last message is {size} tokens and the reply needs {reserve} more, but the "
                                     f"context holds {max_context}; {context_fix(size + reserve, model_limit)}")
        cut = 2 if len(turns) > 2 and turns[0].get("role") == "user" else 1  # a user turn and its reply
        turns, dropped = turns[cut:], dropped + cut
