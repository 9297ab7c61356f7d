"""Base models in the chat: a checkpoint without a chat template runs as a completion model.

Most checkpoints people fine-tune or test with are base models. Both chat front ends (the app and the console)
then keep one running text: each message continues it on a new line, and each reply continues the message before
it directly. The engine reuses the cached prefix of that text from one turn to the next, as it does for a chat.
"""

from __future__ import annotations

from typing import Iterator

from edge.engine import Engine, GenerationOptions
from edge.events import Event


def is_completion_model(engine: Engine) -> bool:
    return engine.tokenizer.chat_template is None


def completion_note(model_name: str) -> str:
    """Said once, where the front end says things (stderr, the status line)."""
    return (f"{model_name or 'this model'} has no chat template, so it runs as a completion model: each message "
            "continues the text so far (--chat-template FILE gives it one)")


def running_text(messages: list[dict]) -> str:
    """The text a completion model continues: a system prompt and messages each on a new line, every reply right
    after the message it continues."""
    text = ""
    for message in messages:
        content = message.get("content") or ""
        if message.get("role") != "assistant" and text and not text.endswith("\n"):
            text += "\n"
        text += content
    return text


def reply_events(engine: Engine, messages: list[dict], reserve: int, options: GenerationOptions | None = None, *,
                 special_tokens_in_messages: bool = False) -> tuple[Iterator[Event], int]:
    """The events of the reply to the last message, generated with `options`, and how many of the oldest messages
    were left out to fit the context: a chat through the model's template (special-token strings in the messages
    encoded as text unless `special_tokens_in_messages`), or the running text for a completion model."""
    if is_completion_model(engine):
        kept, dropped = engine.fit_messages(messages, reserve, running_text)
        return engine.generate(running_text(kept), options), dropped
    kept, dropped = engine.fit_chat(messages, reserve, special_tokens_in_messages=special_tokens_in_messages)
    return engine.chat(kept, options, special_tokens_in_messages=special_tokens_in_messages), dropped
