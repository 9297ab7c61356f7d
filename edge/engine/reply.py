"""One reply: prefill what the KV cache lacks, then steps of a decoding strategy until a stop, one Event per step.

    strategy = decoding_strategy(model, cache, opts, generator, drafter, draft_length, constraint)
    reply = Reply(model, cache, tokenizer, device, eos_token_ids, max_context, opts, strategy, generator, constraint)
    step = reply.prefill(tokens, cached, stats)     # `tokens` (the prompt) grows as the reply does
    yield from reply.events(tokens, step, stats)

Each event carries the text the step adds (after stop strings), its token ids, which of them came from accepted
drafts, the stats so far and, on the last, why the reply ended (`ReplyText`, which the replies of a batch share).
`count_step` adds a step to the stats.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from edge import events as ev
from edge.decoding.constrained import Constraint
from edge.decoding.drafters import Drafter
from edge.decoding.loop import Autoregressive, DecodingStrategy, Step
from edge.decoding.repetition import LoopDetector
from edge.decoding.sampling import history_tensor, next_token
from edge.decoding.speculative import DraftLength, SpeculativeDecoding
from edge.engine.options import GenerationOptions
from edge.errors import CheckpointError
from edge.events import Event, Stats
from edge.model.finite import nonfinite_logits, nonfinite_tensor
from edge.model.kv_cache import KVCache, common_prefix
from edge.model.transformer import Transformer
from edge.text.stopping import StopStrings
from edge.text.tokenizer import StreamDecoder, Tokenizer


def decoding_strategy(model: Transformer, cache: KVCache, opts: GenerationOptions, generator: torch.Generator,
                      drafter: Drafter | None, draft_length: DraftLength, constraint: Constraint | None = None
                      ) -> DecodingStrategy:
    """Speculative decoding with `drafter` (told the reply's task), starting from the configured draft length; plain
    decoding without one."""
    params = opts.sampling
    if drafter is None:
        return Autoregressive(model, cache, params, generator, constraint)
    if opts.task is not None and hasattr(drafter, "set_task"):
        drafter.set_task(opts.task)
    # each call starts from the configured length; its first draft is not timed as drafting: a drafter with a cache
    # of its own (a draft model) first reads the whole prompt, which would count as hundreds of drafted tokens' cost
    length = dataclasses.replace(draft_length, resuming=True)
    return SpeculativeDecoding(model, cache, params, generator, drafter, length, constraint)


@dataclass
class ReplyText:
    """One reply's tokens as events: appended up to an end-of-sequence or a loop, decoded to text, cut at a stop
    string, and the finish reason. What every decoding loop shares: one reply's (Reply.events) and the replies of a
    batch decoded together (edge/engine/batched.py)."""

    tokenizer: Tokenizer
    eos_token_ids: frozenset[int]
    max_context: int
    opts: GenerationOptions
    loops: LoopDetector | None = None  # the loop stop over this reply's tokens (made in __post_init__)
    looped: bool = False  # the reply's tokens ended in a loop: it finishes with FINISH_LOOP

    def __post_init__(self) -> None:
        # ignore_eos (benchmarks) keeps going past loops too
        self.loops = LoopDetector(self.opts.loop_stop) if self.opts.loop_stop and not self.opts.ignore_eos else None
        self.text_stream = StreamDecoder(self.tokenizer)
        self.stops = StopStrings(self.opts.stop)

    def is_eos(self, token: int) -> bool:
        return token in self.eos_token_ids and not self.opts.ignore_eos

    def append(self, tokens: list[int], emitted: list[int]) -> list[int]:
        """Append emitted tokens to `tokens` up to the first end-of-sequence, or up to the token that completes a
        loop (then `looped`). Token by token, so that plain and speculative decoding stop at the same one."""
        appended = []
        for token in emitted:
            appended.append(token)
            if self.is_eos(token):
                break
            if self.loops is not None and self.loops.push(token):
                self.looped = True
                break
        tokens.extend(appended)
        return appended

    def event(self, tokens: list[int], appended: list[int], step: Step, stats: Stats, wall_s: float | None) -> Event:
        """The event of a step that appended `appended` to `tokens` (`wall_s`: the step's time, None for the
        prefill's): its text after the stop strings, the stats counted, the finish reason if the reply ends."""
        stops, text_stream = self.stops, self.text_stream
        finish = ev.FINISH_EOS if self.is_eos(appended[-1]) else ev.FINISH_LOOP if self.looped else None
        visible = appended[:-1] if finish else appended
        drafted_count = sum(step.drafted[: len(visible)])  # accepted drafts lead each step's tokens
        drafted_text, hit_stop = stops.push(text_stream.push(visible[:drafted_count]))
        text = drafted_text
        if not hit_stop:
            target_text, hit_stop = stops.push(text_stream.push(visible[drafted_count:]))
            text += target_text
        count_step(stats, step, len(appended), wall_s)
        finish = finish or self.finish_reason(stats, tokens, hit_stop)
        if finish is not None and not hit_stop:
            tail, hit_stop = stops.push(text_stream.flush())
            text += tail if hit_stop else tail + stops.flush()
            finish = ev.FINISH_STOP_STRING if hit_stop else finish
        return Event(text, tuple(appended), tuple(step.drafted[: len(appended)]), stats.snapshot(), finish,
                     drafted_chars=len(drafted_text))

    def finish_reason(self, stats: Stats, tokens: list[int], hit_stop: bool) -> str | None:
        opts = self.opts
        if hit_stop:
            return ev.FINISH_STOP_STRING
        if stats.generated_tokens >= opts.max_new_tokens:
            return ev.FINISH_MAX_TOKENS
        if len(tokens) >= self.max_context:
            return ev.FINISH_CONTEXT
        if opts.should_stop is not None and opts.should_stop():
            return ev.FINISH_STOPPED
        return None

    def budget(self, stats: Stats, tokens: list[int]) -> int:
        """The most tokens the next step may add."""
        return min(self.opts.max_new_tokens - stats.generated_tokens, self.max_context - len(tokens))


@dataclass
class Reply:
    """The loop of one reply over an engine's model and cache; the cache is kept one token behind `tokens`."""

    model: Transformer
    cache: KVCache
    tokenizer: Tokenizer
    device: torch.device
    eos_token_ids: frozenset[int]
    max_context: int
    opts: GenerationOptions
    strategy: DecodingStrategy
    generator: torch.Generator
    constraint: Constraint | None = None

    def prefill(self, tokens: list[int], cached: list[int], stats: Stats) -> Step:
        """Roll the cache back to the longest prefix of `tokens` it holds (`cached`: what the previous call left in
        it), run the rest, and choose the first token."""
        reuse = common_prefix(cached, tokens[:-1])  # at least the last token is run
        self.cache.rollback(reuse)
        todo = tokens[reuse:]
        params = self.opts.sampling
        t0 = time.perf_counter()
        with torch.inference_mode():
            hidden = self.model(torch.tensor([todo], device=self.device), reuse, self.cache)  # (1, T, D)
            logits = self.model.logits(hidden[:, -1:])[0, -1]  # (V,)
            check_logits(self.model, logits)
            t1 = time.perf_counter()
            if self.constraint is not None:
                logits = self.constraint.mask(logits)
            token = next_token(logits, params, history_tensor(tokens, params, self.device), self.generator)
            if self.constraint is not None:
                self.constraint.consume([token])
        t2 = time.perf_counter()
        stats.prefill_s, stats.reused_tokens, stats.prefill_tokens = t2 - t0, reuse, len(todo)
        return Step(tokens=[token], drafted=[False], verify_s=t1 - t0, sample_s=t2 - t1)

    def events(self, tokens: list[int], step: Step, stats: Stats) -> Iterator[Event]:
        """An event for the prefill's `step`, then one per decoding step, until a finish reason."""
        text = ReplyText(self.tokenizer, self.eos_token_ids, self.max_context, self.opts)
        wall_s = None
        budget = 1  # the prefill emits exactly one token
        while True:
            appended = text.append(tokens, step.tokens[:budget])
            if self.cache.length > len(tokens) - 1:  # a step cached tokens past an end-of-sequence: keep it one behind
                self.cache.rollback(len(tokens) - 1)
            event = text.event(tokens, appended, step, stats, wall_s)
            yield event
            if event.finished:
                return
            budget = text.budget(stats, tokens)
            t0 = time.perf_counter()
            with torch.inference_mode():
                step = self.strategy.step(tokens, budget)
            wall_s = time.perf_counter() - t0


def check_logits(model, logits: torch.Tensor) -> None:
    """A reply's first logits (V,) must be usable: NaN or +Inf there (damaged weights, an overflow) would decode
    garbage or nothing and finish as if all were well. A CheckpointError, one line naming the tensor that holds
    NaN or Inf when a search of the model's weights finds one."""
    problem = nonfinite_logits(logits)
    if problem is None:
        return
    found = nonfinite_tensor(model, everything=True) if isinstance(model, torch.nn.Module) else None
    cause = (f"its tensor {found[0]} holds {found[1]}: the weights are damaged; download the model again"
             if found is not None else "no weight it holds is NaN or Inf, so a computation overflowed; load it with "
             "--dtype float32 (or download it again)")
    raise CheckpointError(f"the model's first logits hold {problem}; {cause}")


def count_step(stats: Stats, step: Step, new_tokens: int, wall_s: float | None) -> None:
    """Add one step to the counters; the first step comes from the prefill (wall_s None), not from decoding."""
    stats.generated_tokens += new_tokens
    stats.steps += 1
    if wall_s is not None:
        stats.decode_tokens += new_tokens
        stats.decode_s += wall_s
    stats.draft_s += step.draft_s
    stats.verify_s += step.verify_s
    stats.sample_s += step.sample_s
    stats.drafted += step.drafted_count
    accepted = sum(step.drafted)
    stats.accepted += accepted
    if step.drafted_count:
        slots = stats.accepted_by_position
        slots.extend([0] * (step.drafted_count - len(slots)))
        for position in range(accepted):
            slots[position] += 1
