"""Sampling transforms against transformers' logits processors, parameter validation, and seeded sampling."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from edge.errors import SamplingError
from edge.decoding.sampling import SamplingParams, apply_repetition_penalty, distribution, next_token, warp


def random_logits(seed: int, vocab: int = 200) -> torch.Tensor:
    return torch.randn(1, vocab, generator=torch.Generator().manual_seed(seed)) * 3  # (1, V)


@pytest.mark.parametrize("seed", range(5))
def test_repetition_penalty_matches_transformers(seed):
    logits = random_logits(seed)
    history = torch.tensor([[3, 17, 17, 150, 199]])
    expected = RepetitionPenaltyLogitsProcessor(1.3)(history, logits.clone())
    torch.testing.assert_close(apply_repetition_penalty(logits, history[0], 1.3), expected)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("option", ["top_k", "top_p", "min_p"])
def test_warpers_keep_the_same_tokens_as_transformers(seed, option):
    logits = random_logits(seed)
    settings = {"top_k": 17, "top_p": 0.8, "min_p": 0.05}
    params = SamplingParams(temperature=0.7, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, option: settings[option]})
    hf = TemperatureLogitsWarper(0.7)(None, logits.clone())
    warper = {"top_k": TopKLogitsWarper(17), "top_p": TopPLogitsWarper(0.8), "min_p": MinPLogitsWarper(0.05)}[option]
    expected = warper(None, hf)
    ours = warp(logits, params)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    torch.testing.assert_close(ours.softmax(-1), expected.softmax(-1))  # logits up to a shift: the same distribution


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = ~torch.isinf(warp(logits, SamplingParams(temperature=1.0, top_p=0.75)))
    assert kept.tolist() == [[True, True, False, False]]
    kept = ~torch.isinf(warp(logits, SamplingParams(temperature=1.0, top_p=0.1)))
    assert kept.tolist() == [[True, False, False, False]]


def test_greedy_distribution_is_one_hot_on_the_argmax():
    logits = random_logits(0)
    probs = distribution(logits, SamplingParams(), torch.empty(0, dtype=torch.long))
    assert probs.sum().item() == 1.0 and probs.argmax() == logits.argmax()


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    params = SamplingParams(temperature=1.0, seed=1234)
    history = torch.empty(0, dtype=torch.long)

    def draw(n: int) -> list[int]:
        generator = params.generator()
        return [next_token(logits, params, history, generator) for _ in range(n)]

    first, second = draw(4000), draw(4000)
    assert first == second
    frequencies = torch.bincount(torch.tensor(first), minlength=3).float() / len(first)
    assert torch.allclose(frequencies, torch.tensor([0.6, 0.3, 0.1]), atol=0.03)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": 2.5}, "temperature"),  # 0 to 2, as OpenAI's API and every front
        ({"top_k": -3}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 1000.0}, "repetition_penalty"),
        ({"stop": ("",)}, "stop"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"seed": "abc"}, "seed"),
    ],
)
def test_invalid_parameters_are_one_line_errors(kwargs, needle):
    with pytest.raises(SamplingError) as error:
        SamplingParams(**kwargs)
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_greedy_ids_choose_as_torch_argmax_does_ties_and_nan_included():
    from edge.decoding.sampling import greedy_ids

    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(5, 1000, generator=generator)  # (n + 1, V) as a verify pass gives
    rows[1, [10, 20]] = 50.0  # a tie: the first one wins
    rows[2, 7] = float("nan")  # NaN counts as the maximum
    rows[3] = float("-inf")
    assert torch.equal(greedy_ids(rows), rows.argmax(-1)) and greedy_ids(rows).tolist()[1:4] == [10, 7, 0]
    assert int(greedy_ids(rows[4])) == int(rows[4].argmax())  # (V,): one position
    half = rows.to(torch.bfloat16)  # other dtypes go through torch
    assert torch.equal(greedy_ids(half), half.argmax(-1))
