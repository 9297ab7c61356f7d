"""What generation reports: `Stats` (counters, never printed by the algorithm) and `Event` (one per decode step)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# why generation ended
FINISH_EOS = "eos"  # the model produced an end-of-sequence token
FINISH_STOP_STRING = "stop_string"  # the text reached one of the caller's stop strings
FINISH_MAX_TOKENS = "max_tokens"  # max_new_tokens were generated
FINISH_CONTEXT = "context_length"  # the context (KV cache) is full


@dataclass
class Stats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV was already cached (earlier turns of a chat)
    prefill_tokens: int = 0  # prompt tokens run through the model before the first decode step
    prefill_s: float = 0.0
    generated_tokens: int = 0
    decode_s: float = 0.0  # wall time of the decode steps (draft + verify + sampling + bookkeeping)
    steps: int = 0  # target forward passes while decoding (verify steps)
    drafted: int = 0
    accepted: int = 0
    accepted_by_position: list[int] = field(default_factory=list)  # accepted count per draft slot
    draft_s: float = 0.0
    verify_s: float = 0.0
    sample_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens emitted per target forward pass (Spec-Bench's metric; 1.00 for plain decoding)."""
        return self.generated_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def snapshot(self) -> "Stats":
        return dataclasses.replace(self, accepted_by_position=list(self.accepted_by_position))

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for name in ("tokens_per_s", "prefill_tokens_per_s", "mean_accepted_tokens", "acceptance_rate"):
            data[name] = getattr(self, name)
        return data


@dataclass(frozen=True)
class Event:
    text: str  # new text since the previous event; never ends inside a UTF-8 character
    token_ids: tuple[int, ...]  # tokens produced by this step
    drafted: tuple[bool, ...]  # per token: True if a drafter proposed it and the target accepted it
    stats: Stats  # snapshot after this step
    finish_reason: str | None = None  # set on the last event only

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
