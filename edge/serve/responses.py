"""The reply bodies and stream chunks of chat and text completions, built from the engine's events.

Beside OpenAI's `usage` (with `prompt_tokens_details.cached_tokens`: prompt tokens whose KV cache was reused from
the earlier turns), each reply carries llama-server's `timings`, with speculation's counters: tokens drafted and
accepted, target passes (steps) and tokens per step.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from edge import events as ev
from edge.events import Event, Stats
from edge.decoding.tools import ToolCall, parse_tool_calls

FINISH_REASONS = {  # edge's finish reason -> OpenAI's
    ev.FINISH_EOS: "stop",
    ev.FINISH_STOP_STRING: "stop",
    ev.FINISH_MAX_TOKENS: "length",
    ev.FINISH_CONTEXT: "length",
    ev.FINISH_STOPPED: "stop",  # the client went away; nobody reads it
    ev.FINISH_LOOP: "stop",  # the reply repeated itself (the loop stop); `edge_finish_reason` says "loop"
}


def loop_note(last: Event) -> dict:
    """The choice's `edge_finish_reason`: "loop" where the loop stop ended the reply (OpenAI's reason says "stop")."""
    return {"edge_finish_reason": ev.FINISH_LOOP} if last.finish_reason == ev.FINISH_LOOP else {}


def usage(stats: Stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.reused_tokens}}


def timings(stats: Stats) -> dict:
    """llama-server's field names; prompt_* is the prefill (cached tokens excluded), predicted_* the decode steps
    (every generated token but the first, which comes from the prefill pass)."""
    return {
        "cache_n": stats.reused_tokens,
        "prompt_n": stats.prefill_tokens,
        "prompt_ms": stats.prefill_s * 1e3,
        "prompt_per_second": stats.prefill_tokens_per_s,
        "predicted_n": stats.decode_tokens,
        "predicted_ms": stats.decode_s * 1e3,
        "predicted_per_second": stats.tokens_per_s,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "steps": stats.steps,
        "tokens_per_step": stats.mean_accepted_tokens,
    }


def server_sent_event(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


@dataclass(frozen=True)
class Reply:
    """One reply's identity, and its bodies: `whole` for a plain response, `chunk` for each streamed delta."""

    chat: bool  # chat.completion, or text_completion
    model: str
    tools: tuple[dict, ...] | None = None  # tools offered, whose calls are read from the reply (edge/decoding/tools.py)
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.key

    def whole(self, text: str, last: Event) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": FINISH_REASONS[last.finish_reason],
                  **loop_note(last)}
        calls = []
        if self.tools:
            text, calls = parse_tool_calls(text, self.tools)
        if calls:
            choice["finish_reason"] = "tool_calls"
            choice["message"] = {"role": "assistant", "content": text or None,
                                 "tool_calls": [call.openai() for call in calls]}
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(last.stats), "timings": timings(last.stats)}

    def chunk(self, text: str, last: Event | None = None, *, first: bool = False, tool_calls: bool = False) -> dict:
        """A streamed delta; `last` (the final event) adds the finish reason ("tool_calls" with `tool_calls`) and
        the timings; the first chat chunk names the role."""
        finish = "tool_calls" if tool_calls else FINISH_REASONS[last.finish_reason] if last is not None else None
        choice = {"index": 0, "logprobs": None, "finish_reason": finish, **(loop_note(last) if last else {})}
        if self.chat:
            choice["delta"] = ({"role": "assistant", "content": text} if first else
                               {"content": text} if text or last is None else {})
        else:
            choice["text"] = text
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        return {**body, "timings": timings(last.stats)} if last is not None else body

    def tool_call_chunk(self, calls: list[ToolCall]) -> dict:
        """The calls of a streamed reply, whole, in one delta (each with its index, as OpenAI streams them)."""
        choice = {"index": 0, "logprobs": None, "finish_reason": None,
                  "delta": {"tool_calls": [call.openai(index) for index, call in enumerate(calls)]}}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self, last: Event) -> dict:
        """stream_options.include_usage: the chunk after the last delta, with no choices."""
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage(last.stats)}

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}
