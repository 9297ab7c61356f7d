"""Several replies decoded together: edge-serve's slots. Each reply is one sequence of a SequenceBatch
(edge/decoding/batch.py), whose every step is one fused pass over all of them, and ReplyText (edge/engine/reply.py)
turns its tokens into the events the same reply alone gives: text cut at stop strings, the loop stop, the finish
reasons and the stats.

    replies = BatchedReplies.for_engine(engine, slots=4, prompt_cache=256 * 2**20)  # None: no fused step here
    reply = replies.start(prompt_ids, opts)                  # prompt_ids, grammar = chat_prompt(...) (prepared.py)
    while replies.running:
        for reply, event in replies.step():                  # one event per reply that chose a token this step
            ...
    replies.remove(reply)                                    # a cancelled request: its slot is free at once

A reply here runs without a grammar (the engine's own loop runs those). Where the engine's drafter has no weights or
cache of its own (ngram, retrieval: a drafter with `fresh()`), a reply that speculates drafts with its own copy of
it, and its verify rows (its last token and up to the engine's draft length of drafted ones) ride in the same pass
as everyone else's rows; its acceptance is its own. It drafts only in a pass where it is the one reply decoding
(DRAFTING_LIMIT): beside others, a draft's rows cost what their rows would, and a rejected draft is lost work. Else it
decodes plainly, one row a pass. Its stats count the passes it took part in: `prefill_s` the ones until its first
token, each later pass as one decode step.

A slot keeps the keys and values of the last reply it ran (SequenceBatch): a new reply starts from the longest prefix
of its prompt any slot holds and prefills only the rest, so a conversation's next turn, or a prompt that opens with
the same system prompt as an earlier one, skips what is already there (`usage.cached_tokens`). With a prompt cache
(`prompt_cache` bytes of host memory, PromptStore), what a slot held moves there when another reply takes the slot,
so a conversation whose slot served others meanwhile, or a prompt asked again, still starts from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from edge.decoding.batch import PREFILL_CHUNK, Sequence, SequenceBatch
from edge.decoding.loop import Step
from edge.decoding.prompt_store import PromptStore
from edge.decoding.speculative import DraftLength
from edge.engine.engine import Engine
from edge.engine.options import GenerationOptions
from edge.engine.prompts import check_prompt
from edge.engine.reply import ReplyText
from edge.errors import SamplingError
from edge.events import Event, Stats
from edge.kernels.runner import FUSED_CHUNK
from edge.model.kernel_glue import ModelTensors
from edge.model.transformer import Transformer


# A pass drafts only for a reply decoding alone in it: on the default model served to 4 clients, drafting in every
# pass made 0.86x the tokens/s of plain slots (158 against 183), while one client drafting alone made 1.15x (121
# against 105). With this rule, four rounds: 0.98x plain slots, inside the rounds' noise (docs/benchmarks.md,
# "Several clients at once")
DRAFTING_LIMIT = 1


def batch_rows(engine: Engine) -> int:
    """The most rows one fused pass of the engine's model takes over a plain KV cache (FUSED_CHUNK; a float32
    checkpoint's fewer); 0 where its replies cannot be decoded together: a model that does not run on edge's fused
    CPU step (an exported bundle, a GPU, a 16-bit dtype), or a quantized KV cache, which the batch's cache is not."""
    model = engine.model
    runner = getattr(model, "runner", None)
    if not isinstance(model, Transformer) or runner is None:
        return 0
    probe = model.new_cache(1)
    if type(engine.cache) is not type(probe):
        return 0
    for rows in (FUSED_CHUNK, runner.max_rows):
        if runner.fuses(ModelTensors(model), rows, model.dtype, probe):
            return rows
    return 0


@dataclass(eq=False)
class BatchedReply:
    """One reply's sequence in the batch, and what its events are made from."""

    sequence: Sequence
    text: ReplyText
    tokens: list[int]  # the prompt, then the reply's tokens as ReplyText appended them
    stats: Stats
    pass_s: float = 0.0  # time of the passes it took part in since its last token
    counted: tuple[int, int] = (0, 0)  # its sequence's accepted and drafted tokens its events have counted

    @property
    def slot(self) -> int:
        return self.sequence.region

    def advance(self, emitted: list[int]) -> Event:
        """The event of the tokens its sequence chose in one pass: the first pass that chose closes its prefill,
        each later one is a decode step (its accepted drafts, then the target's own token)."""
        first = self.stats.steps == 0
        wall_s, self.pass_s = self.pass_s, 0.0
        if first:
            self.stats.prefill_s = wall_s
        sequence = self.sequence
        accepted, drafted = sequence.accepted - self.counted[0], sequence.drafted - self.counted[1]
        self.counted = (sequence.accepted, sequence.drafted)
        appended = self.text.append(self.tokens, emitted)
        marks = [True] * accepted + [False] * max(0, len(emitted) - accepted)
        step = Step(tokens=emitted, drafted=marks[:len(emitted)], drafted_count=drafted, verify_s=wall_s)
        return self.text.event(self.tokens, appended, step, self.stats, None if first else wall_s)


class BatchedReplies:
    """The replies of one SequenceBatch over an engine's model: `slots` sequences, each with the engine's context."""

    def __init__(self, engine: Engine, slots: int, rows: int, prompt_cache: int = 0) -> None:
        if not 1 <= slots <= rows:
            raise SamplingError(f"{slots} slots do not fit one fused pass of this model, which takes at most {rows} "
                                f"rows; use at most {rows}")
        self.engine = engine
        # a speculating reply's rows a pass: its last token and its draft, every slot's within one fused call
        length = engine.draft_length  # adaptive: the length it starts from
        wanted = DraftLength().k if length.adaptive else length.k
        self.draft_length = max(0, min(wanted, rows // slots - 1)) if self._drafts_per_slot(engine) else 0
        chunk = max(1, min(PREFILL_CHUNK, rows // slots))  # a prompt's chunk leaves the others' steps light
        self.batch = SequenceBatch(engine.model, regions=slots, context=engine.max_context, prefill_chunk=chunk,
                                   max_rows=rows, drafting_limit=DRAFTING_LIMIT,
                                   store=PromptStore(prompt_cache) if prompt_cache > 0 else None)
        self.replies: dict[Sequence, BatchedReply] = {}
        self.last_size = 0  # sequences in the last pass

    @classmethod
    def for_engine(cls, engine: Engine, slots: int, prompt_cache: int = 0) -> "BatchedReplies | None":
        """`slots` replies decoded together on this engine's model with a `prompt_cache` of that many bytes (0: none),
        or None where it cannot (batch_rows)."""
        rows = batch_rows(engine)
        return cls(engine, min(slots, rows), rows, prompt_cache) if rows else None

    @staticmethod
    def _drafts_per_slot(engine: Engine) -> bool:
        return engine.drafter is not None and callable(getattr(engine.drafter, "fresh", None))

    @property
    def speculates(self) -> bool:
        """Whether a reply that speculates drafts here (each with its own copy of the engine's drafter)."""
        return self.draft_length > 0

    @property
    def slots(self) -> int:
        return self.batch.regions

    @property
    def free(self) -> int:
        return len(self.batch.free_regions())

    @property
    def prompt_cache_bytes(self) -> int:
        """Bytes the prompt cache holds now (0 without one)."""
        store = self.batch.store
        return store.nbytes if store is not None else 0

    @property
    def running(self) -> list[BatchedReply]:
        return list(self.replies.values())

    def start(self, prompt_ids: list[int], opts: GenerationOptions) -> BatchedReply:
        """A reply to `prompt_ids` in a free slot, from the next step on; a PromptError for a prompt that does not
        fit the context, a SamplingError when every slot is taken."""
        engine = self.engine
        check_prompt(prompt_ids, engine.max_context, engine.model.config)
        sampling = opts.sampling
        room = engine.max_context - len(prompt_ids)
        drafter = engine.drafter.fresh() if opts.speculate and self.speculates else None
        sequence = self.batch.add(prompt_ids, sampling, min(opts.max_new_tokens, room),
                                  frozenset() if opts.ignore_eos else engine.eos_token_ids,
                                  sampling.generator(engine.device), drafter=drafter, draft_length=self.draft_length)
        stats = Stats(prompt_tokens=len(prompt_ids), reused_tokens=sequence.reused,
                      prefill_tokens=len(prompt_ids) - sequence.reused)
        reply = BatchedReply(sequence, ReplyText(engine.tokenizer, engine.eos_token_ids, engine.max_context, opts),
                             list(prompt_ids), stats)
        self.replies[sequence] = reply
        return reply

    def step(self) -> list[tuple[BatchedReply, Event]]:
        """One fused pass over every running reply; an event for each that chose a token. A finished reply leaves
        the batch at once."""
        stepping = [self.replies[sequence] for sequence in self.batch.running]
        self.last_size = len(stepping)
        t0 = time.perf_counter()
        with torch.inference_mode():
            chosen = self.batch.step()
        wall_s = time.perf_counter() - t0
        for reply in stepping:
            reply.pass_s += wall_s
        emitted: dict[Sequence, list[int]] = {}
        for sequence, token in chosen:
            emitted.setdefault(sequence, []).append(token)
        events = []
        for sequence, tokens in emitted.items():
            reply = self.replies[sequence]
            event = reply.advance(tokens)
            events.append((reply, event))
            if event.finished:
                self.remove(reply)
        return events

    def remove(self, reply: BatchedReply) -> None:
        """Drop a reply (finished, or its request cancelled): its slot is free for the next start()."""
        if self.replies.pop(reply.sequence, None) is not None:
            self.batch.remove(reply.sequence)
