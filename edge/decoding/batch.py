"""Several sequences decoded together (continuous batching): every step is one fused pass that carries each running
sequence's rows, a chunk of its prompt or its one decode row, so that a memory-bound model reads its weights once
for all of them. Sequences join and leave between any two steps.

    batch = SequenceBatch(model, regions=4, context=1024)
    first = batch.add(prompt_ids, SamplingParams(temperature=0), max_new_tokens=128, eos_token_ids={2})
    while batch.running:
        for sequence, token in batch.step():      # the tokens this step chose, one per sequence that chose one
            ...
    batch.remove(first)                            # (a cancelled request): its region is free at once
    batch.add(prompt_ids, params, 128, drafter=NGramDrafter(), draft_length=4)   # speculative, in the same passes

Each sequence owns a region of one KV cache (`context` positions); its rows write and attend only there, at the
positions they have in it (edge/kernels/csrc/interface.h RowSlots). A region keeps what it holds after its sequence
leaves: a new sequence starts from the longest prefix of its prompt that any region holds (a chat's next request,
or another with the same system prompt), copied into its own region rather than run again; with a `store`
(edge/decoding/prompt_store.py), what a region held goes to host memory when another sequence takes the region, and
comes back the same way for a prompt that begins with it. Every row computes what it computes when the sequence runs
alone, so a greedy reply is token for token the one plain decoding gives, and a seeded sampled one
the same reply as alone (its own generator, penalty and history). A sequence with a drafter adds its verify rows
(its last token and its draft) to the pass and keeps what its own verification accepts (edge/decoding/verify.py),
so each sequence's acceptance is its own; greedy replies stay those of plain decoding. With `drafting_limit`, a pass
that carries more decoding sequences than that drafts for none of its greedy ones (each row then costs about what a
draft row would, and a rejected draft row is lost work; the reply is the same either way); a sampled one always
drafts, so that its seed's reply never depends on the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edge.decoding.drafters.base import Draft, DraftSampler, Drafter
from edge.decoding.prompt_store import PromptStore
from edge.decoding.sampling import SamplingParams, history_tensor, next_token
from edge.decoding.speculative import verify_rows
from edge.errors import SamplingError
from edge.kernels.runner import FUSED_CHUNK
from edge.model.kernel_glue import step_rows
from edge.model.kv_cache import common_prefix
from edge.model.transformer import Transformer

PREFILL_CHUNK = 64  # prompt rows a sequence adds to one pass: a long prompt does not stall the others' steps
MAX_ROWS = FUSED_CHUNK  # rows of one pass, every sequence's together: what one fused call takes


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
    drafter: Drafter | None = None  # proposes the tokens its verify rows check (None: one plain row a step)
    draft_length: int = 0
    sampler: DraftSampler | None = None
    cached: int = 0  # tokens whose keys/values its region holds
    finish: str | None = None  # "eos" or "length" once it has ended
    reused: int = 0  # prompt tokens whose keys/values came from an earlier sequence's (not run again)
    steps: int = 0  # passes that chose its tokens
    drafted: int = 0  # tokens its drafter proposed, and those accepted
    accepted: int = 0

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length:]


@dataclass
class SequenceBatch:
    model: Transformer
    regions: int
    context: int
    prefill_chunk: int = PREFILL_CHUNK
    max_rows: int = MAX_ROWS
    drafting_limit: int | None = None  # a pass with more decoding sequences than this drafts for none (None: all)
    store: PromptStore | None = None  # where a region's keys/values go when another sequence takes the region
    sequences: list[Sequence] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cache = self.model.new_cache(self.regions * self.context)
        self.device = self.model.device
        # what each region's slots hold: the tokens whose keys/values are there, kept after its sequence leaves (a
        # chat's next request, or another with the same system prompt, starts from them)
        self.held: list[list[int]] = [[] for _ in range(self.regions)]

    @property
    def running(self) -> list[Sequence]:
        return [sequence for sequence in self.sequences if sequence.finish is None]

    def free_regions(self) -> list[int]:
        taken = {sequence.region for sequence in self.sequences}
        return [region for region in range(self.regions) if region not in taken]

    def add(self, prompt: list[int], params: SamplingParams, max_new_tokens: int, eos_token_ids=frozenset(),
            generator: torch.Generator | None = None, drafter: Drafter | None = None,
            draft_length: int = 4) -> Sequence:
        """A new sequence in a free region; it runs from the next step. With a drafter (its own instance: a drafter
        keeps state about the tokens it drafts for), each decode step verifies up to `draft_length` drafted tokens."""
        free = self.free_regions()
        if not free:
            raise SamplingError(f"all {self.regions} sequences of the batch are running; remove one or wait")
        if not prompt or len(prompt) + max_new_tokens > self.context:
            raise SamplingError(f"a prompt of {len(prompt)} tokens and {max_new_tokens} new ones do not fit a "
                                f"sequence's {self.context} positions; shorten it or ask for fewer tokens")
        params = params.resolved()
        generator = generator or params.generator(self.device)
        region, reused = self._place(list(prompt), free)
        sequence = Sequence(region, list(prompt), len(prompt), params, generator, max_new_tokens,
                            frozenset(eos_token_ids), drafter, draft_length if drafter is not None else 0,
                            DraftSampler(params, generator, None, self.model.config.vocab_size), cached=reused,
                            reused=reused)
        self.sequences.append(sequence)
        return sequence

    def _place(self, prompt: list[int], free: list[int]) -> tuple[int, int]:
        """The free region for a prompt and how many of its leading tokens need not run again: the free region
        holding the longest prefix of it, topped up with a copy of a longer one's keys/values from any region (a
        running sequence's prefix slots no longer change) or from the store. What the region held beyond that goes
        to the store first. At least the prompt's last token runs: its logits choose the first new token."""
        wanted = prompt[:-1]
        region = max(free, key=lambda r: (common_prefix(self.held[r], wanted), -r))
        kept = common_prefix(self.held[region], wanted)
        target = region * self.context
        if self.store is not None and len(self.held[region]) > kept:  # about to be written over
            held = len(self.held[region])
            self.store.keep(self.held[region], self.cache.keys[:, :, :, target:target + held],
                            self.cache.values[:, :, :, target:target + held])
        donor = max(range(self.regions), key=lambda r: (common_prefix(self.held[r], wanted), r == region))
        shared = common_prefix(self.held[donor], wanted)
        stored, in_store = self.store.longest(wanted) if self.store is not None else (None, 0)
        sources, start = (), 0  # the keys/values to copy from, (L, 1, Hkv, S, Dh), and the first slot there
        if stored is not None and in_store > max(shared, kept):
            sources, kept = (stored.keys, stored.values), in_store
        elif shared > kept:
            sources, start, kept = (self.cache.keys, self.cache.values), donor * self.context, shared
        for tensor, source in zip((self.cache.keys, self.cache.values), sources):
            tensor[:, :, :, target:target + kept] = source[:, :, :, start:start + kept]
        self.held[region] = wanted[:kept]
        return region, kept

    def remove(self, sequence: Sequence) -> None:
        """Drop a sequence (finished or cancelled): its region is free for the next add()."""
        self.sequences.remove(sequence)

    def step(self) -> list[tuple[Sequence, int]]:
        """One fused pass over every running sequence's pending rows (a prompt's chunk, or its last token and its
        draft); each sequence whose pass reached its last token chooses what comes next. Returns (sequence, token)
        for each token chosen, in order."""
        plan = self._plan()
        if not plan:
            return []
        tokens, slots, firsts = [], [], []
        for sequence, begin, rows, _ in plan:
            base = sequence.region * self.context
            tokens += rows
            slots += range(base + begin, base + begin + len(rows))
            firsts += [base] * len(rows)
        with torch.inference_mode():
            passed = step_rows(self.model, torch.tensor(tokens), torch.tensor(slots), torch.tensor(firsts),
                               self.cache)
        if passed is None:
            raise SamplingError("several sequences in one pass run on edge's fused CPU step, which this model does "
                                "not use; serve one request at a time (--parallel 1)")
        logits = passed[1]  # (T, V)
        chosen, row = [], 0
        for sequence, begin, rows, draft in plan:
            own = logits[row:row + len(rows)]  # (rows, V)
            row += len(rows)
            if draft.tokens:
                emitted = self._verified(sequence, draft, own)
            else:
                sequence.cached = begin + len(rows)
                if sequence.cached < len(sequence.tokens):
                    continue  # more of its prompt to run before it chooses
                emitted = [next_token(own[-1], sequence.params,
                                      history_tensor(sequence.tokens, sequence.params, self.device),
                                      sequence.generator)]
            sequence.steps += 1
            for token in emitted:
                sequence.tokens.append(token)
                chosen.append((sequence, token))
                if token in sequence.eos_token_ids:
                    sequence.finish = "eos"
                elif len(sequence.generated) >= sequence.max_new_tokens:
                    sequence.finish = "length"
                if sequence.finish is not None:
                    break
            sequence.cached = min(sequence.cached, len(sequence.tokens) - 1)
        for sequence, _, _, _ in plan:
            self.held[sequence.region] = sequence.tokens[:sequence.cached]
        return chosen

    def _plan(self) -> list[tuple[Sequence, int, list[int], Draft]]:
        """(sequence, first token index, rows' tokens, draft) of the rows each running sequence adds to the pass: the
        decoding ones first (a decode step never waits for someone else's prompt), then prompt chunks in the room
        left."""
        plan = []
        decoding = [sequence for sequence in self.running if len(sequence.tokens) - sequence.cached == 1]
        drafting = self.drafting_limit is None or len(decoding) <= self.drafting_limit
        for sequence in decoding:
            # a sampled sequence drafts whatever else runs: its seed's reply must not depend on the others
            draft = self._draft(sequence) if drafting or not sequence.params.greedy else Draft(tokens=[])
            plan.append((sequence, sequence.cached, sequence.tokens[-1:] + draft.tokens, draft))
        room = self.max_rows - sum(len(rows) for _, _, rows, _ in plan)
        for sequence in self.running:
            if sequence in decoding or room <= 0:
                continue
            count = min(len(sequence.tokens) - sequence.cached, self.prefill_chunk, room)  # a chunk of its prompt
            plan.append((sequence, sequence.cached, sequence.tokens[sequence.cached:sequence.cached + count],
                         Draft(tokens=[])))
            room -= count
        return plan

    def _draft(self, sequence: Sequence) -> Draft:
        """The sequence's draft for this step: at most draft_length tokens, never past its token budget or region."""
        room = min(sequence.draft_length, sequence.max_new_tokens - len(sequence.generated) - 1,
                   self.context - len(sequence.tokens))
        if sequence.drafter is None or room <= 0:
            return Draft(tokens=[])
        draft = sequence.drafter.propose(sequence.tokens, room, sequence.sampler)
        return draft if len(draft.tokens) <= room else Draft(tokens=draft.tokens[:room],
                                                             probs=None if draft.probs is None else draft.probs[:room])

    def _verified(self, sequence: Sequence, draft: Draft, logits: torch.Tensor) -> list[int]:
        """The tokens a verify pass over the sequence's last token and draft emits: the accepted drafts and the
        target's own next token; its region then holds the keys/values of every token but that last one."""
        verdict = verify_rows(sequence.params, sequence.tokens, draft, logits, sequence.generator)
        sequence.drafter.observe(verdict.accepted, len(draft.tokens), 0.0)
        sequence.drafted += len(draft.tokens)
        sequence.accepted += verdict.accepted
        sequence.cached = len(sequence.tokens) + verdict.accepted  # the last token and the accepted drafts
        return verdict.tokens(draft.tokens)
