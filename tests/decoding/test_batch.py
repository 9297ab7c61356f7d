"""Continuous batching: sequences that share one fused pass a step, joining and leaving at any step, reply token for
token as each does alone (greedy, and seeded sampling with the repetition penalty), on GGUF block formats."""

from __future__ import annotations

import pytest
import torch

from edge import Engine
from edge.decoding.batch import SequenceBatch
from edge.decoding.prompt_store import PromptStore
from edge.decoding.sampling import SamplingParams
from edge.errors import SamplingError
from tests.gguf_files import Q4_K_M, write_gguf
from tests.helpers import greedy

PROMPTS = [[5, 9, 14, 3, 22, 7], list(range(30, 110)), [41, 2, 17], [8, 8, 8, 8, 19, 26, 4, 11, 13]]


@pytest.fixture(scope="module", params=["q8_0", "q4_k_m"])
def engine(request, llama_dir, tokenizer_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch")
    if request.param == "q4_k_m":  # the k-quants need matrices of whole 256-wide blocks
        from tests.conftest import build_checkpoint

        wide = build_checkpoint(folder / "wide", "llama3", tokenizer_dir, hidden_size=256, intermediate_size=512)
        return Engine.load(write_gguf(wide, folder / "tiny.q4_k_m.gguf", Q4_K_M), max_context=256)
    return Engine.load(write_gguf(llama_dir, folder / "tiny.q8_0.gguf", "q8_0"), max_context=256)


def run_batch(engine, params: list[SamplingParams], max_new_tokens: int, joins: list[int]) -> list[list[int]]:
    """Every prompt through one batch of 3 regions: prompt i joins at step joins[i] (or when a region frees up)."""
    batch = SequenceBatch(engine.model, regions=3, context=128, prefill_chunk=16)
    waiting, added, step = list(range(len(PROMPTS))), {}, 0
    while waiting or batch.running:
        for i in list(waiting):
            if joins[i] <= step and batch.free_regions():
                added[i] = batch.add(PROMPTS[i], params[i], max_new_tokens)
                waiting.remove(i)
        batch.step()
        for sequence in [s for s in batch.sequences if s.finish is not None]:
            batch.remove(sequence)  # its region goes to the next prompt at once
        step += 1
    return [added[i].generated for i in range(len(PROMPTS))]


def test_greedy_replies_in_a_batch_are_the_replies_alone(engine):
    alone = [greedy(engine, prompt, 20) for prompt in PROMPTS]
    together = run_batch(engine, [SamplingParams(temperature=0)] * len(PROMPTS), 20, joins=[0, 0, 3, 5])
    assert together == alone


def test_seeded_sampled_replies_in_a_batch_are_the_replies_alone(engine):
    params = [SamplingParams(temperature=0.9, seed=10 + i, repetition_penalty=1.3, repeat_last_n=8)
              for i in range(len(PROMPTS))]
    alone = [greedy(engine, prompt, 16, **{name: getattr(p, name) for name in
                                           ("temperature", "seed", "repetition_penalty", "repeat_last_n", "top_k",
                                            "top_p", "min_p")}, loop_stop=0)
             for prompt, p in zip(PROMPTS, params)]
    together = run_batch(engine, params, 16, joins=[1, 0, 0, 2])
    assert together == alone


def test_a_full_batch_and_a_prompt_too_long_are_one_line_errors(engine):
    batch = SequenceBatch(engine.model, regions=1, context=32)
    batch.add([1, 2, 3], SamplingParams(temperature=0), 8)
    with pytest.raises(SamplingError, match="all 1 sequences"):
        batch.add([1, 2, 3], SamplingParams(temperature=0), 8)
    batch = SequenceBatch(engine.model, regions=2, context=32)
    with pytest.raises(SamplingError, match="do not fit"):
        batch.add(list(range(30)), SamplingParams(temperature=0), 8)


def test_a_sequence_sees_only_its_own_region(engine):
    """The same prompt alone and beside a different one: the neighbour's keys never enter its attention."""
    batch = SequenceBatch(engine.model, regions=2, context=64)
    first = batch.add(PROMPTS[0], SamplingParams(temperature=0), 12)
    batch.add(PROMPTS[3], SamplingParams(temperature=0), 12)
    while batch.running:
        batch.step()
    alone = SequenceBatch(engine.model, regions=1, context=64)
    only = alone.add(PROMPTS[0], SamplingParams(temperature=0), 12)
    while alone.running:
        alone.step()
    assert first.generated == only.generated
    assert torch.equal(torch.tensor(first.generated), torch.tensor(greedy(engine, PROMPTS[0], 12)))


def drafting_batch(engine, params: SamplingParams, regions: int, prompts, max_new_tokens: int):
    from edge.decoding.drafters.ngram import NGramDrafter

    batch = SequenceBatch(engine.model, regions=regions, context=128, prefill_chunk=16)
    added = [batch.add(prompt, params, max_new_tokens, drafter=NGramDrafter(), draft_length=3) for prompt in prompts]
    while batch.running:
        batch.step()
    return added


def test_speculating_sequences_in_a_batch_reply_as_plain_decoding_alone(engine):
    """Each sequence verifies its own draft in the shared pass: greedy replies are plain decoding's, whatever the
    others accept, and the drafter does get tokens accepted."""
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], PROMPTS[0], [9, 9, 9, 9, 9, 9]]
    together = drafting_batch(engine, SamplingParams(temperature=0), 3, prompts, 24)
    assert [sequence.generated for sequence in together] == [greedy(engine, prompt, 24) for prompt in prompts]
    assert sum(sequence.accepted for sequence in together) > 0
    assert any(sequence.steps < len(sequence.generated) for sequence in together)  # fewer passes than tokens


def test_a_seeded_speculating_sequence_replies_the_same_among_others_as_alone(engine):
    params = SamplingParams(temperature=0.9, seed=4, repetition_penalty=1.2, repeat_last_n=16)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], PROMPTS[3]]
    together = drafting_batch(engine, params, 2, prompts, 20)
    alone = [drafting_batch(engine, params, 1, [prompt], 20)[0] for prompt in prompts]
    assert [sequence.generated for sequence in together] == [sequence.generated for sequence in alone]


def test_a_prompt_starts_from_the_longest_prefix_any_region_holds(engine):
    """A chat's next request reuses its region; a request sharing a running one's system prompt gets a copy of those
    keys/values: neither runs them again, and both reply as alone."""
    greedy_params = SamplingParams(temperature=0)
    system = list(range(40, 72))
    batch = SequenceBatch(engine.model, regions=2, context=128)
    first = batch.add(system + [5, 6], greedy_params, 8)
    batch.step()  # its prompt: slots written, the first token chosen
    second = batch.add(system + [9, 9, 3], greedy_params, 8)  # beside the running one
    assert second.reused == len(system) and second.region != first.region
    while batch.running:
        batch.step()
    assert first.generated == greedy(engine, system + [5, 6], 8)
    assert second.generated == greedy(engine, system + [9, 9, 3], 8)
    batch.remove(first)
    follow_up = first.tokens + [7, 8]  # the same chat, one turn on
    third = batch.add(follow_up, greedy_params, 8)
    assert third.region == first.region and third.reused == len(first.tokens) - 1
    while batch.running:
        batch.step()
    assert third.generated == greedy(engine, follow_up, 8)


def test_a_conversation_whose_region_served_others_starts_from_the_prompt_cache(engine):
    """With one region and a store: a chat's keys/values go to the store when another prompt takes the region, and
    its next turn copies them back instead of running them again; a sampled seeded reply and a greedy one both reply
    as alone."""
    greedy_params = SamplingParams(temperature=0)
    batch = SequenceBatch(engine.model, regions=1, context=128, store=PromptStore(64 * 2**20))
    chat = list(range(40, 75))
    first = batch.add(chat, greedy_params, 6)
    while batch.running:
        batch.step()
    batch.remove(first)
    other = batch.add([3, 1, 4, 1, 5], greedy_params, 4)  # takes the region: the chat goes to the store
    assert len(batch.store) == 1 and other.reused == 0
    while batch.running:
        batch.step()
    batch.remove(other)
    follow_up = first.tokens + [7, 8]
    sampled = SamplingParams(temperature=0.9, seed=4, repetition_penalty=1.2, repeat_last_n=8)
    again = batch.add(follow_up, sampled, 8)
    assert again.reused == len(first.tokens) - 1  # every token whose keys/values the region held
    while batch.running:
        batch.step()
    assert first.generated == greedy(engine, chat, 6)
    assert again.generated == greedy(engine, follow_up, 8, temperature=0.9, seed=4, repetition_penalty=1.2,
                                     repeat_last_n=8, loop_stop=0)
    batch.remove(again)
    asked_again = batch.add([3, 1, 4, 1, 5], greedy_params, 4)  # the other prompt, from the store in turn
    assert asked_again.reused == 4
    while batch.running:
        batch.step()
    assert asked_again.generated == other.generated == greedy(engine, [3, 1, 4, 1, 5], 4)


def test_without_a_store_a_region_taken_by_another_prompt_keeps_nothing(engine):
    batch = SequenceBatch(engine.model, regions=1, context=128)
    for prompt in ([5, 9, 14, 3, 22, 7], [41, 2, 17], [5, 9, 14, 3, 22, 7]):
        sequence = batch.add(prompt, SamplingParams(temperature=0), 2)
        while batch.running:
            batch.step()
        batch.remove(sequence)
    assert sequence.reused == 0


def test_batched_replies_are_the_replies_alone_on_every_cpu_path(llama_dir, tmp_path, monkeypatch):
    """Each path this CPU runs (portable, avx2, avx512): greedy plain and speculating sequences among others, and a
    seeded sampled one, reply as alone (the rows' regions, RowSlots, on each path's attention and matmul)."""
    from edge.kernels import cpu_paths

    gguf = write_gguf(llama_dir, tmp_path / "tiny.q8_0.gguf", "q8_0")
    sampled = SamplingParams(temperature=0.9, seed=3, repetition_penalty=1.2, repeat_last_n=8)
    for path in cpu_paths.runnable_paths():
        monkeypatch.setenv("EDGE_CPU_KERNEL", path)
        engine = Engine.load(gguf, max_context=256)
        assert engine.model.runner.matmul.path.startswith(path)
        together = run_batch(engine, [SamplingParams(temperature=0)] * 3 + [sampled], 12, joins=[0, 0, 2, 3])
        assert together[:3] == [greedy(engine, prompt, 12) for prompt in PROMPTS[:3]], path
        assert together[3] == greedy(engine, PROMPTS[3], 12, temperature=0.9, seed=3, repetition_penalty=1.2,
                                     repeat_last_n=8, loop_stop=0), path
        drafted = drafting_batch(engine, SamplingParams(temperature=0), 3, PROMPTS[:3], 12)
        assert [sequence.generated for sequence in drafted] == [greedy(engine, p, 12) for p in PROMPTS[:3]], path


def test_with_a_drafting_limit_greedy_sequences_draft_only_alone_and_sampled_ones_always(engine):
    """drafting_limit=1 (edge-serve's slots): a pass with two greedy sequences decoding drafts for neither; replies stay
    plain decoding's, and a seeded sampled sequence (which always drafts) replies as it does alone."""
    from edge.decoding.drafters.base import Draft
    from edge.decoding.drafters.ngram import NGramDrafter

    class Repeating:  # proposes its last token again and again: a draft every step, mostly rejected
        name = "repeating"

        def propose(self, tokens, k, sampler):
            return Draft(tokens=[tokens[-1]] * k)

        def observe(self, accepted, drafted, step_s=0.0):
            pass

    prompts, repeating = [[9, 9, 9, 9, 9, 9], PROMPTS[0]], PROMPTS[3]
    sampled = SamplingParams(temperature=0.9, seed=4, repetition_penalty=1.2, repeat_last_n=16)
    batch = SequenceBatch(engine.model, regions=3, context=128, prefill_chunk=16, drafting_limit=1)
    first, second = [batch.add(prompt, SamplingParams(temperature=0), 24, drafter=NGramDrafter(), draft_length=3)
                     for prompt in prompts]
    seeded = batch.add(repeating, sampled, 20, drafter=Repeating(), draft_length=3)
    while not (first.generated and second.generated):  # both prompts run
        batch.step()
    for _ in range(4):  # both decoding: neither drafts
        batch.step()
    assert first.drafted == second.drafted == 0
    while batch.running:
        batch.step()
    assert [first.generated, second.generated] == [greedy(engine, prompt, 24) for prompt in prompts]
    alone = SequenceBatch(engine.model, regions=1, context=128, prefill_chunk=16)
    own = alone.add(repeating, sampled, 20, drafter=Repeating(), draft_length=3)
    while alone.running:
        alone.step()
    assert seeded.generated == own.generated and seeded.drafted == own.drafted > 0
