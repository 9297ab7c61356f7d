"""The repetition guard: the loop stop's detector, the repetition penalty's window, and both under speculation (greedy
speculative output stops where plain output stops; a sampled verify pass penalizes each position as plain decoding
would)."""

from __future__ import annotations

import pytest
import torch

from edge import Engine
from edge.decoding import speculative as speculative_module
from edge.decoding.drafters.base import Draft
from edge.decoding.repetition import LoopDetector, loop_length
from edge.decoding.sampling import SamplingParams, distribution, history_tensor
from edge.decoding.speculative import DraftLength, SpeculativeDecoding
from edge.events import FINISH_LOOP
from tests.helpers import greedy_events


def test_a_cycle_repeated_over_the_stop_length_is_a_loop_and_a_short_repeat_is_not():
    assert loop_length([7] * 100, 64) == 64  # one token 64 times
    cycle = [1, 2, 3, 4, 5, 6]
    assert loop_length([9, 8] + cycle * 20, 64) == 2 + 64  # "la femme au martyre, " over and over
    paragraph = list(range(100, 180))  # 80 tokens said again: three times make the loop
    assert loop_length([5] + paragraph * 3, 64) == 1 + 240
    assert loop_length([5] + paragraph * 2 + paragraph[:79], 64) is None
    assert loop_length(cycle * 10, 64) is None  # 60 tokens: shorter than the stop length
    assert loop_length([10, 11, 12, 11, 12, 13] * 4 + list(range(50)), 64) is None  # varied text
    assert loop_length([7] * 100, 0) is None  # 0: off


def test_the_detector_keeps_saying_loop_once_it_has():
    detector = LoopDetector(8)
    said = [detector.push(token) for token in [1, 2] * 8]
    assert said.index(True) == 7 and all(said[7:]) and detector.period == 2


def test_the_penalty_looks_at_the_newest_repeat_last_n_tokens_and_is_off_when_greedy_unless_asked():
    tokens = list(range(10))
    assert SamplingParams().recent(tokens) == tokens  # 64 newest
    assert SamplingParams(repeat_last_n=3).recent(tokens) == [7, 8, 9]
    assert SamplingParams(repeat_last_n=-1).recent(tokens) == tokens
    assert SamplingParams(repeat_last_n=0).recent(tokens) == []
    assert SamplingParams().penalty == 1.1 and SamplingParams(temperature=0).penalty == 1.0
    assert SamplingParams(temperature=0, repetition_penalty=1.3).penalty == 1.3
    assert SamplingParams(temperature=0).recent(tokens) == []  # no penalty: nothing to look at


def test_greedy_speculation_stops_at_the_same_loop_as_plain_decoding(llama_dir):
    """The tiny model's greedy text loops quickly: with a short loop stop both end at the same token, said "loop"."""
    plain = Engine.load(llama_dir, max_context=256)
    fast = Engine.load(llama_dir, max_context=256, drafter="ngram")
    for prompt in ["The quick brown fox", "import os\nimport os\n"]:
        expected = greedy_events(plain, prompt, 200, ignore_eos=False, loop_stop=12)
        events = greedy_events(fast, prompt, 200, ignore_eos=False, loop_stop=12)
        ids = [t for e in expected for t in e.token_ids]
        assert [t for e in events for t in e.token_ids] == ids
        assert events[-1].finish_reason == expected[-1].finish_reason == FINISH_LOOP
        assert loop_length(ids, 12) == len(ids)  # stopped at the token that completed the loop
        assert events[-1].stats.drafted > 0  # the drafter proposed: the verify path ran


def test_ignore_eos_runs_past_loops(llama_dir):
    """Benchmarks generate a fixed number of tokens, whatever the text does."""
    events = greedy_events(Engine.load(llama_dir, max_context=256), "The quick brown fox", 100, loop_stop=12)
    assert events[-1].stats.generated_tokens == 100 and events[-1].finish_reason != FINISH_LOOP


@pytest.mark.parametrize("params", [
    SamplingParams(repeat_last_n=4, seed=0),  # the defaults with a short window: drafts push tokens out of it
    SamplingParams(repeat_last_n=-1, repetition_penalty=1.5, temperature=1.0),
    SamplingParams(temperature=0, repetition_penalty=1.3, repeat_last_n=3),
])
def test_a_verify_pass_penalizes_each_position_as_plain_decoding_does(llama_dir, params, monkeypatch):
    """Exactness of speculative sampling under the penalty: the target distribution the verification compares each
    drafted token with is plain decoding's own at that position (its history: the tokens and the drafts before it,
    the newest repeat_last_n of them). Stochastic verification keeps a distribution it is given (test_verify.py)."""
    engine = Engine.load(llama_dir, max_context=64, drafter="ngram")
    decoding = SpeculativeDecoding(engine.model, engine.cache, params, torch.Generator().manual_seed(0),
                                   engine.drafter, DraftLength.fixed(4))
    tokens, draft = [5, 6, 7, 8, 9, 6, 7], [8, 5, 3, 3]
    logits = torch.randn(len(draft) + 1, engine.model.config.vocab_size, generator=torch.Generator().manual_seed(1))
    seen = {}

    def capture(name):
        def verify(*args, target_ids=None):
            seen[name] = args[2] if name == "probs" else args[1]  # the target's distributions, or its choices
            seen["ids"] = target_ids  # the candidates' ids where the distributions are top-k's handful
            return speculative_module.Verdict(0, 0)
        return verify
    monkeypatch.setattr(speculative_module, "verify_stochastic", capture("probs"))
    monkeypatch.setattr(speculative_module, "verify_greedy", capture("choice"))
    decoding._verify(tokens, Draft(tokens=draft), logits)
    for i, row in enumerate(logits):
        history = history_tensor(tokens + draft[:i], params, "cpu")
        expected = distribution(row, params, history)
        if params.greedy:
            assert int(seen["choice"][i]) == int(expected.argmax())
        else:
            probs = seen["probs"][i]
            if seen["ids"] is not None:  # (k,) over candidate ids -> (V,)
                probs = torch.zeros_like(expected).index_put_((seen["ids"][i],), probs)
            torch.testing.assert_close(probs, expected)
