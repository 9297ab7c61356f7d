"""Message content as text: special-token strings a message holds are not control tokens.

A chat template writes the role markers (`<|im_start|>user`, `<|im_end|>`) around each message's content, and the
rendered prompt is then encoded with the special tokens recognised, as transformers does. Content that holds such a
string (pasted text, a web page, another model's output) would become real markers, so a message could forge a turn
of another role. Here each special-token string inside a message's content is replaced, before rendering, by a
placeholder the template passes through like any text; after rendering the placeholders are put back and their
places in the prompt recorded, so the encoder (Tokenizer.encode_rendered) encodes exactly those as plain text. The
template's own markers, and the prompt text itself, are what transformers makes.

    masked = MaskedMessages.of(messages, find_special)     # find_special(text) -> [(start, end), ...]
    text = template.render(masked.messages)
    chat = masked.restore(text)                            # RenderedChat(text, literal_spans)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from edge.errors import PromptError

# Unicode noncharacters, reserved for a program's internal use: a placeholder is one, the index of the string it
# stands for, and the same one again
_SENTINELS = [chr(code) for code in range(0xFDD0, 0xFDF0)]


@dataclass(frozen=True)
class RenderedChat:
    """A rendered chat: its text, and the spans of it (start, end) that came from special-token strings inside the
    messages' content, which encode as plain text."""

    text: str
    literal_spans: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class MaskedMessages:
    """Messages whose content's special-token strings are placeholders, and how to put them back."""

    messages: list[dict]
    strings: tuple[str, ...]  # what each placeholder stands for, by index
    sentinel: str

    @classmethod
    def of(cls, messages: Sequence[dict], find_special: Callable[[str], list[tuple[int, int]]],
           other_text: str = "") -> MaskedMessages:
        """`messages` with every span `find_special` finds in a content string (or a text block's text) replaced by
        a placeholder; the messages themselves are not changed. `other_text`: the rest of what the template reads
        (the messages' other fields, tools, ...), which must not hold the placeholders' character either."""
        texts = [text for message in messages for text in _content_texts(message)] + [other_text]
        sentinel = next((mark for mark in _SENTINELS if not any(mark in text for text in texts)), None)
        if sentinel is None:
            raise PromptError("the messages hold every character from U+FDD0 to U+FDEF (Unicode noncharacters); "
                              "remove them")
        strings: list[str] = []

        def masked(text: str) -> str:
            spans = find_special(text)
            if not spans:
                return text
            pieces, at = [], 0
            for start, end in spans:
                pieces += [text[at:start], f"{sentinel}{len(strings)}{sentinel}"]
                strings.append(text[start:end])
                at = end
            return "".join(pieces) + text[at:]

        return cls([_with_content(message, masked) for message in messages], tuple(strings), sentinel)

    def restore(self, text: str) -> RenderedChat:
        """The rendered `text` with the placeholders put back, and where they were. A template that cut a
        placeholder apart is a PromptError: the string it stood for cannot be told from the template's own."""
        if not self.strings:
            return RenderedChat(text)
        pieces, spans, at, size = [], [], 0, 0
        for match in re.finditer(f"{self.sentinel}(\\d+){self.sentinel}", text):
            index = int(match.group(1))
            if index >= len(self.strings):
                continue  # not a placeholder of ours: left in, and refused below
            pieces.append(text[at:match.start()])
            size += match.start() - at
            pieces.append(self.strings[index])
            spans.append((size, size + len(self.strings[index])))
            size += len(self.strings[index])
            at = match.end()
        pieces.append(text[at:])
        restored = "".join(pieces)
        if self.sentinel in restored:
            raise PromptError("the chat template cut apart a special-token string inside a message, so it cannot be "
                              "kept as text; remove it from the message, or allow special tokens in messages "
                              "(special_tokens_in_messages=True, --special-tokens-in-messages)")
        return RenderedChat(restored, tuple(spans))


def _content_texts(message: Any) -> list[str]:
    """The text of a message's content: the string, or the text blocks' text."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [content]
    if isinstance(content, (list, tuple)):
        return [block["text"] for block in content if isinstance(block, dict) and isinstance(block.get("text"), str)]
    return []


def _with_content(message: Any, change: Callable[[str], str]) -> Any:
    """A copy of `message` with `change` applied to its content's text (the message as is when it has none)."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": change(content)}
    if isinstance(content, (list, tuple)):
        blocks = [{**block, "text": change(block["text"])}
                  if isinstance(block, dict) and isinstance(block.get("text"), str) else block for block in content]
        return {**message, "content": blocks}
    return message
