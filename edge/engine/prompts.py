"""What a prompt may be: valid text or a sequence of token ids, not empty, inside the vocabulary and shorter than the
context. Each refusal is one PromptError (ContextLengthError for the length) naming the fix."""

from __future__ import annotations

import operator

from edge.errors import ContextLengthError, PromptError
from edge.model.config import ModelConfig


def checked_text(text: str, what: str) -> str:
    """`text` if it is valid Unicode throughout; a lone surrogate (undecodable bytes read with surrogateescape, as
    Python reads a command line or a pipe) is a PromptError naming where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PromptError(f"{what} is not valid UTF-8 text (an undecodable byte at character {error.start}); "
                          "save or pipe it as UTF-8") from None
    return text


def token_ids(prompt: object) -> list[int]:
    """A prompt given as token ids: any sequence of integers (ints, numpy or 0-d torch integers); bytes would read as
    byte values, so they are refused like every other non-prompt."""
    kind = type(prompt).__name__
    if isinstance(prompt, (bytes, bytearray)):
        raise PromptError(f"a prompt is text (str) or a list of token ids (ints), got {kind}; decode it first: "
                          "prompt.decode('utf-8')")
    try:
        return [operator.index(token) for token in prompt]
    except TypeError:
        raise PromptError(f"a prompt is text (str) or a list of token ids (ints), got {kind}") from None


def check_prompt(prompt_ids: list[int], max_context: int, config: ModelConfig) -> None:
    """Refuse an empty prompt, one that leaves no room in a context of `max_context` tokens for a reply, and token
    ids outside the model's vocabulary."""
    if not prompt_ids:
        raise PromptError("the prompt is empty; pass some text to continue")
    if len(prompt_ids) >= max_context:
        raise ContextLengthError(f"the prompt is {len(prompt_ids)} tokens but the context holds {max_context}; "
                                 f"{context_fix(len(prompt_ids) + 1, config.max_position_embeddings)}")
    vocab = config.vocab_size
    bad = next((token for token in prompt_ids if not 0 <= token < vocab), None)
    if bad is not None:
        raise PromptError(f"token id {bad} is outside the vocabulary (0..{vocab - 1}); encode with this model's tokenizer")


def context_fix(needed: int, model_limit: int) -> str:
    """How to make `needed` tokens fit: a longer context (--max-context), unless the model's own limit
    (`model_limit`, its max_position_embeddings) is the bound."""
    if needed > model_limit:
        return f"shorten it: the model itself reads at most {model_limit} tokens"
    return f"shorten it, or load with a longer context (--max-context {needed}, or max_context={needed})"
