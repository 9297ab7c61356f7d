"""A request made ready to decode: its prompt as token ids and the grammar its reply must follow (None: free text).
Engine.generate and Engine.chat prepare theirs here, and so do replies decoded together in a batch
(edge/engine/batched.py), so that a request gives the same prompt either way.

    ids, grammar = text_prompt(tokenizer, "Once upon a time", opts)
    ids, grammar = chat_prompt(tokenizer, messages, opts, history=[])   # history: the last call's tokens, if any
"""

from __future__ import annotations

from typing import Sequence

from edge.decoding.constrained import Grammar, response_format_grammar
from edge.decoding.tools import plan_tool_use
from edge.engine.cache import continued_tokens
from edge.engine.options import GenerationOptions
from edge.engine.prompts import checked_text, token_ids
from edge.errors import PromptError
from edge.text.chat_template import check_messages
from edge.text.tokenizer import Tokenizer


def text_prompt(tokenizer: Tokenizer, prompt: str | Sequence[int], opts: GenerationOptions
                ) -> tuple[list[int], Grammar | None]:
    """A plain prompt's ids (text, encoded with the tokenizer's special tokens, or token ids) and its grammar."""
    if isinstance(prompt, str):
        if not prompt:
            raise PromptError("the prompt is empty; pass some text to continue")
        ids = tokenizer.encode(checked_text(prompt, "the prompt"), add_special_tokens=True)
    else:
        ids = token_ids(prompt)
    return ids, response_format_grammar(opts.response_format)


def chat_prompt(tokenizer: Tokenizer, messages: Sequence[dict], opts: GenerationOptions, history: list[int], *,
                template_kwargs: dict | None = None, tools: Sequence[dict] | None = None,
                tool_choice: str | dict | None = None,
                special_tokens_in_messages: bool = False) -> tuple[list[int], Grammar | None]:
    """A conversation rendered with the chat template (and its tools, edge/decoding/tools.py) as ids, continuing
    `history` where the rendering starts with it (edge/engine/cache.py), and its grammar: a forced tool call's or
    the response format's. Special-token strings typed in a message are text unless `special_tokens_in_messages`."""
    check_messages(messages)
    plan = plan_tool_use(tokenizer, list(messages), tools, tool_choice)
    kwargs = {**(template_kwargs or {}), **plan.template_kwargs}
    chat = tokenizer.render_chat(plan.messages, special_tokens_in_messages=special_tokens_in_messages, **kwargs)
    grammar = plan.grammar or response_format_grammar(opts.response_format)
    checked_text(chat.text, "the chat")
    return continued_tokens(tokenizer, history, chat), grammar
