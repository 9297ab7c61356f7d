"""Several sequences decoded together (continuous batching): every step is one fused pass that carries each running
sequence's rows, a chunk of its prompt or its one decode row, so that a memory-bound model reads its weights once
for all of them. Sequences join and leave between any two steps.

    batch = SequenceBatch(model, regions=4, context=1024)
    first = batch.add(prompt_ids, SamplingParams(temperature=0), max_new_tokens=128, eos_token_ids={2})
    while batch.running:
        for sequence, token in batch.step():      # the tokens this step chose, one per sequence that chose one
            ...
    batch.remove(first)                            # (a cancelled request): its region is free at once

Each sequence owns a region of one KV cache (`context` positions); its rows write and attend only there, at the
positions they have in it (edge/kernels/csrc/interface.h RowSlots). Every row computes what it computes when the
sequence runs alone, so a greedy reply is token for token the one plain decoding gives, and a seeded sampled one
the same reply as alone (its own generator, penalty and history).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edge.decoding.sampling import SamplingParams, history_tensor, next_token
from edge.errors import SamplingError
from edge.model.kernel_glue import step_rows
from edge.model.transformer import Transformer

PREFILL_CHUNK = 64  # prompt rows a sequence adds to one pass: a long prompt does not stall the others' steps


@dataclass(eq=False)
class Sequence:
    """One request's tokens and its place in the batch."""

    region: int  # its cache region: positions [region * context, (region + 1) * context)
    tokens: list[int]  # the prompt, then every chosen token
    prompt_length: int
    params: SamplingParams
    generator: torch.Generator
    max_new_tokens: int
    eos_token_ids: frozenset[int]
    cached: int = 0  # tokens whose keys/values its region holds
    finish: str | None = None  # "eos" or "length" once it has ended

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length:]


@dataclass
class SequenceBatch:
    model: Transformer
    regions: int
    context: int
    prefill_chunk: int = PREFILL_CHUNK
    sequences: list[Sequence] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cache = self.model.new_cache(self.regions * self.context)
        self.device = self.model.device

    @property
    def running(self) -> list[Sequence]:
        return [sequence for sequence in self.sequences if sequence.finish is None]

    def free_regions(self) -> list[int]:
        taken = {sequence.region for sequence in self.sequences}
        return [region for region in range(self.regions) if region not in taken]

    def add(self, prompt: list[int], params: SamplingParams, max_new_tokens: int, eos_token_ids=frozenset(),
            generator: torch.Generator | None = None) -> Sequence:
        """A new sequence in a free region; it runs from the next step."""
        free = self.free_regions()
        if not free:
            raise SamplingError(f"all {self.regions} sequences of the batch are running; remove one or wait")
        if not prompt or len(prompt) + max_new_tokens > self.context:
            raise SamplingError(f"a prompt of {len(prompt)} tokens and {max_new_tokens} new ones do not fit a "
                                f"sequence's {self.context} positions; shorten it or ask for fewer tokens")
        params = params.resolved()
        sequence = Sequence(free[0], list(prompt), len(prompt), params, generator or params.generator(self.device),
                            max_new_tokens, frozenset(eos_token_ids))
        self.sequences.append(sequence)
        return sequence

    def remove(self, sequence: Sequence) -> None:
        """Drop a sequence (finished or cancelled): its region is free for the next add()."""
        self.sequences.remove(sequence)

    def step(self) -> list[tuple[Sequence, int]]:
        """One fused pass over every running sequence's pending rows; each sequence whose pass reached its last
        token chooses the next one. Returns (sequence, token) for each choice made."""
        plan = []  # (sequence, first token index, end index) of the rows each sequence adds
        for sequence in self.running:
            pending = len(sequence.tokens) - sequence.cached  # 1 while decoding
            count = min(pending, self.prefill_chunk)
            plan.append((sequence, sequence.cached, sequence.cached + count))
        if not plan:
            return []
        tokens, slots, firsts = [], [], []
        for sequence, begin, end in plan:
            base = sequence.region * self.context
            tokens += sequence.tokens[begin:end]
            slots += range(base + begin, base + end)
            firsts += [base] * (end - begin)
        with torch.inference_mode():
            passed = step_rows(self.model, torch.tensor(tokens), torch.tensor(slots), torch.tensor(firsts),
                               self.cache)
        if passed is None:
            raise SamplingError("several sequences in one pass run on edge's fused CPU step, which this model does "
                                "not use; serve one request at a time (--parallel 1)")
        logits = passed[1]  # (T, V)
        chosen, row = [], 0
        for sequence, begin, end in plan:
            row += end - begin
            sequence.cached = end
            if end < len(sequence.tokens):
                continue  # more of its prompt to run before it chooses
            token = next_token(logits[row - 1], sequence.params,
                               history_tensor(sequence.tokens, sequence.params, self.device), sequence.generator)
            sequence.tokens.append(token)
            chosen.append((sequence, token))
            if token in sequence.eos_token_ids:
                sequence.finish = "eos"
            elif len(sequence.generated) >= sequence.max_new_tokens:
                sequence.finish = "length"
        return chosen
