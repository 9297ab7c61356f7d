"""The Engine: streaming events, stop conditions, multi-turn cache reuse, preallocation and bad input."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from edge import Engine, PromptError, SamplingError
from edge.events import FINISH_CONTEXT, FINISH_EOS, FINISH_MAX_TOKENS, FINISH_STOP_STRING, FINISH_STOPPED
from tests.helpers import PROMPT, greedy_events

generated = partial(greedy_events, reset=False)  # a call's events, on the cache the call before left


@pytest.fixture(scope="module")
def engine(llama_dir) -> Engine:
    return Engine.load(llama_dir, max_context=256)


def ids_of(events) -> list[int]:
    return [token for event in events for token in event.token_ids]


def test_events_stream_text_and_tokens(engine):
    events = generated(engine, max_new_tokens=20, ignore_eos=True)
    assert len(events) == 20 and all(len(e.token_ids) == 1 for e in events)
    assert [e.finish_reason for e in events] == [None] * 19 + [FINISH_MAX_TOKENS]
    assert all(e.drafted == (False,) for e in events)
    text = "".join(e.text for e in events)
    assert text == engine.tokenizer.decode(ids_of(events))
    last = events[-1].stats
    assert last.generated_tokens == 20 and last.steps == 20 and last.mean_accepted_tokens == 1.0
    assert last.tokens_per_s > 0 and last.prompt_tokens == len(engine.tokenizer.encode(PROMPT))


def test_generation_is_deterministic_and_matches_a_fresh_engine(engine, llama_dir):
    first = ids_of(generated(engine, max_new_tokens=16, ignore_eos=True))
    again = ids_of(generated(engine, max_new_tokens=16, ignore_eos=True))  # reuses the cached prompt
    fresh = ids_of(Engine.load(llama_dir, max_context=64).generate(PROMPT, max_new_tokens=16, ignore_eos=True,
                                                                   temperature=0.0))
    assert first == again == fresh


def test_stops_on_any_of_several_eos_ids(engine):
    reference = ids_of(generated(engine, max_new_tokens=24, ignore_eos=True))
    first_eos, second_eos = reference[9], reference[5]
    saved = engine.eos_token_ids
    try:
        engine.eos_token_ids = frozenset({first_eos, second_eos})
        events = generated(engine, max_new_tokens=24, ignore_eos=False)
    finally:
        engine.eos_token_ids = saved
    stop_at = min(reference.index(first_eos), reference.index(second_eos))
    assert ids_of(events) == reference[: stop_at + 1]  # the end-of-sequence token is reported
    assert events[-1].finish_reason == FINISH_EOS
    assert "".join(e.text for e in events) == engine.tokenizer.decode(reference[:stop_at])  # but not shown


def test_stop_string_cuts_the_text(engine):
    full = "".join(e.text for e in generated(engine, max_new_tokens=40, ignore_eos=True))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), "the fixture model should produce visible text"
    events = generated(engine, max_new_tokens=40, ignore_eos=True, stop=[stop, "never-produced"])
    assert events[-1].finish_reason == FINISH_STOP_STRING
    assert "".join(e.text for e in events) == full[: full.index(stop)]


def test_context_full_ends_generation(llama_dir):
    prompt_length = len(Engine.load(llama_dir, max_context=64).tokenizer.encode(PROMPT))
    small = Engine.load(llama_dir, max_context=prompt_length + 6)
    events = list(small.generate(PROMPT, max_new_tokens=100, ignore_eos=True, temperature=0.0))
    assert events[-1].finish_reason == FINISH_CONTEXT
    assert prompt_length + len(ids_of(events)) == prompt_length + 6


def test_multi_turn_chat_prefills_only_the_new_turn(engine):
    engine.reset()
    messages = [{"role": "user", "content": "Hello there"}]
    events = list(engine.chat(messages, max_new_tokens=12, temperature=0.0))
    first = events[-1].stats
    assert first.reused_tokens == 0
    reply = "".join(e.text for e in events)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    second = list(engine.chat(messages, max_new_tokens=12, temperature=0.0))[-1].stats
    assert second.reused_tokens >= first.prompt_tokens
    assert second.prefill_tokens == second.prompt_tokens - second.reused_tokens
    assert second.prefill_tokens < second.prompt_tokens // 2


def test_reused_cache_gives_the_same_answer_as_a_full_prefill(engine, llama_dir):
    engine.reset()
    messages = [{"role": "user", "content": "Hello there"}]
    first_reply = list(engine.chat(messages, max_new_tokens=8, temperature=0.0))
    reply = "".join(e.text for e in first_reply)
    if first_reply[-1].finish_reason == FINISH_EOS:  # the template closes the turn with the same token
        assert engine.history[-1] in engine.eos_token_ids
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
    events = list(engine.chat(messages, max_new_tokens=16, ignore_eos=True, temperature=0.0))
    assert events[-1].stats.reused_tokens > 0
    prompt = engine.history[: -len(ids_of(events))]
    fresh = Engine.load(llama_dir, max_context=256)
    assert ids_of(events) == ids_of(fresh.generate(prompt, max_new_tokens=16, ignore_eos=True, temperature=0.0))
    assert fresh.tokenizer.decode(prompt, skip_special_tokens=False) == fresh.tokenizer.apply_chat_template(messages)


def test_stopping_mid_reply_leaves_the_engine_consistent(engine):
    expected = ids_of(generated(engine, max_new_tokens=12, ignore_eos=True))
    stream = engine.generate("Something else entirely", max_new_tokens=50, ignore_eos=True, temperature=0.0)
    for _ in range(3):
        next(stream)
    stream.close()  # the consumer stops reading
    assert ids_of(generated(engine, max_new_tokens=12, ignore_eos=True)) == expected


def test_should_stop_ends_with_flushed_text_like_a_token_limit(engine):
    calls = []

    def stop_after_five():
        calls.append(1)
        return len(calls) >= 5

    stopped = generated(engine, max_new_tokens=50, ignore_eos=True, should_stop=stop_after_five)
    assert stopped[-1].finish_reason == FINISH_STOPPED and len(ids_of(stopped)) == 5  # checked after every event
    limited = generated(engine, max_new_tokens=5, ignore_eos=True)
    assert ids_of(stopped) == ids_of(limited)
    assert "".join(e.text for e in stopped) == "".join(e.text for e in limited)


def test_events_say_which_characters_came_from_accepted_drafts(llama_dir):
    spec = Engine.load(llama_dir, max_context=256, drafter="ngram", draft_length=4)
    events = list(spec.generate("the cat the cat the cat the cat", max_new_tokens=40, ignore_eos=True, temperature=0.0))
    assert all(0 <= e.drafted_chars <= len(e.text) for e in events)
    assert all(e.drafted_chars == 0 for e in events if not any(e.drafted))
    assert sum(e.drafted_chars for e in events) > 0  # this repetitive prompt has accepted n-gram drafts


def test_kv_cache_is_allocated_once(engine):
    keys, values = engine.cache.keys.data_ptr(), engine.cache.values.data_ptr()
    generated(engine, max_new_tokens=30, ignore_eos=True)
    list(engine.chat([{"role": "user", "content": "hi"}], max_new_tokens=5, temperature=0.0))
    assert (engine.cache.keys.data_ptr(), engine.cache.values.data_ptr()) == (keys, values)
    assert engine.cache.keys.shape[3] == 256


def test_seeded_sampling_is_reproducible(engine):
    options = dict(max_new_tokens=16, ignore_eos=True, temperature=0.9, top_p=0.95, top_k=50, min_p=0.01,
                   repetition_penalty=1.1)
    a = ids_of(generated(engine, seed=7, **options))
    b = ids_of(generated(engine, seed=7, **options))
    c = ids_of(generated(engine, seed=8, **options))
    assert a == b and a != c


def test_bad_input_is_a_one_line_error(engine):
    cases = [
        (PromptError, lambda: generated(engine, "")),
        (PromptError, lambda: generated(engine, [])),
        (PromptError, lambda: generated(engine, "word " * 300)),
        (PromptError, lambda: generated(engine, [1, 2, 10_000])),
        (PromptError, lambda: list(engine.chat([]))),
        (SamplingError, lambda: generated(engine, temperature=-1)),
        (SamplingError, lambda: generated(engine, max_new_tokens=0)),
        (SamplingError, lambda: generated(engine, top_p=0)),
        (SamplingError, lambda: generated(engine, temprature=0.5)),
    ]
    for kind, call in cases:
        with pytest.raises(kind) as error:
            call()
        assert "\n" not in str(error.value) and len(str(error.value)) > 20


def test_prompt_too_long_names_the_numbers(engine):
    with pytest.raises(PromptError) as error:
        generated(engine, "word " * 300)
    assert "256" in str(error.value) and "the model itself reads at most 512 tokens" in str(error.value)


def test_engine_runs_in_bfloat16(llama_dir):
    engine = Engine.load(llama_dir, dtype="bfloat16", max_context=64)
    assert engine.cache.keys.dtype == torch.bfloat16
    events = list(engine.generate(PROMPT, max_new_tokens=8, ignore_eos=True, temperature=0.0))
    assert len(ids_of(events)) == 8


def test_a_full_context_drops_the_oldest_turns_but_keeps_the_system_prompt(llama_dir):
    small = Engine.load(llama_dir, max_context=160)
    turns = [{"role": "system", "content": "Be brief."}]
    for index in range(8):
        turns += [{"role": "user", "content": f"question {index} about the quick brown fox"},
                  {"role": "assistant", "content": "the fox jumps over the lazy dog " * 2}]
    turns.append({"role": "user", "content": "last question"})
    kept, dropped = small.fit_chat(turns, reserve=16)
    assert dropped > 0 and kept[0] == turns[0] and kept[-1] == turns[-1] and kept == turns[:1] + turns[1 + dropped:]
    assert kept[1]["role"] == "user"  # whole turns are dropped
    reply = list(small.chat(kept, max_new_tokens=16, temperature=0.0))
    assert reply[-1].finish_reason is not None
    with pytest.raises(PromptError, match="the model itself reads at most 512 tokens"):
        small.fit_chat([{"role": "user", "content": "fox " * 400}], reserve=16)
    with pytest.raises(PromptError, match=r"shorten it, or load with a longer context \(--max-context \d+"):
        small.fit_chat([{"role": "user", "content": "fox " * 60}], reserve=16)


def test_options_come_as_one_record_or_as_keywords(engine):
    from edge import GenerationOptions

    def tokens(*args, **kwargs) -> list[int]:
        engine.reset()
        return [t for e in engine.generate("The quick brown fox", *args, **kwargs) for t in e.token_ids]

    options = GenerationOptions(max_new_tokens=6, ignore_eos=True, temperature=0.0)
    assert tokens(options) == tokens(max_new_tokens=6, ignore_eos=True, temperature=0.0)
    assert len(tokens(options, max_new_tokens=3)) == 3  # keywords override the record
    with pytest.raises(SamplingError, match="GenerationOptions"):
        tokens({"max_new_tokens": 3})
