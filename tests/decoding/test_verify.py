"""Verification functions: greedy rules, and a chi-square test that stochastic verification keeps the target's
distribution exactly (and that the same test catches a broken verifier)."""

from __future__ import annotations

import bisect
import itertools

import pytest
import torch

from edge.decoding import verify as verify_module
from edge.decoding.verify import Verdict, verify_greedy, verify_stochastic

VOCAB, LENGTH, SAMPLES = 4, 3, 12_000


def test_greedy_accepts_the_matching_prefix_and_corrects_the_rest():
    assert verify_greedy([5, 6, 7], torch.tensor([5, 6, 9, 1])) == Verdict(2, 9)
    assert verify_greedy([5, 6, 7], torch.tensor([5, 6, 7, 1])) == Verdict(3, 1)  # bonus token
    assert verify_greedy([5], torch.tensor([4, 1])) == Verdict(0, 4)
    assert verify_greedy([], torch.tensor([8])) == Verdict(0, 8)
    assert Verdict(2, 9).tokens([5, 6, 7]) == [5, 6, 9]


def markov(seed: int, sharpness: float) -> torch.Tensor:
    """A random transition matrix (V, V): row = previous token, column = next token."""
    logits = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)) * sharpness
    return logits.softmax(-1)


TARGET, DRAFT = markov(1, 1.5), markov(2, 1.0)
DRAFT_CUMULATIVE = DRAFT.cumsum(-1).tolist()  # (V, V) as lists: a draw is one uniform number and a search


def draw(cumulative: list[float], generator: torch.Generator) -> int:
    """A token from a distribution given by its cumulative sums (torch.multinomial's draw, a tenth of its time)."""
    return min(bisect.bisect_right(cumulative, float(torch.rand((), generator=generator)) * cumulative[-1]),
               len(cumulative) - 1)


def speculative_sequence(verifier, generator: torch.Generator, k: int, deterministic: bool,
                         target: torch.Tensor = TARGET) -> tuple[int, ...]:
    """Generate LENGTH tokens after token 0 with draft-then-verify over the two Markov chains."""
    out: list[int] = []
    last = 0
    while len(out) < LENGTH:
        draft, rows, prev = [], [], last
        for _ in range(k):
            q = DRAFT[prev]
            token = int(q.argmax()) if deterministic else draw(DRAFT_CUMULATIVE[prev], generator)
            draft.append(token)
            rows.append(q)
            prev = token
        contexts = [last, *draft]
        target_probs = torch.stack([target[c] for c in contexts])  # (k + 1, V)
        draft_probs = None if deterministic else torch.stack(rows)  # (k, V)
        verdict = verifier(draft, draft_probs, target_probs, generator)
        emitted = verdict.tokens(draft)
        out += emitted
        last = emitted[-1]
    return tuple(out[:LENGTH])


def chi_square_p_value(verifier, k: int, deterministic: bool = False, seed: int = 0,
                       target: torch.Tensor = TARGET, samples: int = SAMPLES) -> float:
    generator = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(samples):
        sequence = speculative_sequence(verifier, generator, k, deterministic, target)
        counts[sequence] = counts.get(sequence, 0) + 1
    statistic, cells = 0.0, 0
    for sequence in itertools.product(range(VOCAB), repeat=LENGTH):
        probability, prev = 1.0, 0
        for token in sequence:
            probability *= float(target[prev, token])
            prev = token
        expected = probability * samples
        if expected == 0:  # a sequence the target never emits must never be emitted
            assert counts.get(sequence, 0) == 0, sequence
            continue
        statistic += (counts.get(sequence, 0) - expected) ** 2 / expected
        cells += 1
    degrees = torch.tensor((cells - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(degrees, torch.tensor(statistic / 2, dtype=torch.float64)))


@pytest.mark.slow
@pytest.mark.parametrize("k, deterministic", [(1, False), (3, False), (2, True)])
def test_stochastic_verification_keeps_the_target_distribution(k, deterministic):
    assert chi_square_p_value(verify_stochastic, k, deterministic) > 1e-3


def accept_everything(draft, draft_probs, target_probs, generator):
    return Verdict(len(draft), int(torch.multinomial(target_probs[len(draft)], 1, generator=generator)))


def resample_from_target(draft, draft_probs, target_probs, generator):
    """Broken on purpose: on rejection it samples from p_target instead of the residual max(0, p_target - p_draft)."""
    original = verify_module.verify_stochastic(draft, draft_probs, target_probs, generator)
    if original.accepted < len(draft):
        row = target_probs[original.accepted]
        return Verdict(original.accepted, int(torch.multinomial(row, 1, generator=generator)))
    return original


@pytest.mark.slow
@pytest.mark.parametrize("broken", [accept_everything, resample_from_target])
def test_the_statistical_test_catches_a_broken_verifier(broken):
    """With a sixth of the samples the test of a correct verifier takes (p about 1e-150 for the subtler of the two
    faults), so the full-size test catches either all the more."""
    assert chi_square_p_value(broken, k=2, samples=SAMPLES // 6) < 1e-6



ORDERS = [torch.randperm(VOCAB, generator=torch.Generator().manual_seed(n)) for n in range(8)]  # by draft length


def candidate_verifier(draft, draft_probs, target_probs, generator):
    """verify_stochastic given each position's distribution as candidates: the tokens of nonzero probability in a
    shuffled order, as a top-k sampler hands them over."""
    order = ORDERS[len(draft)]  # (V,)
    kept = target_probs[:, order] > 0  # (n + 1, V): every row keeps K tokens
    ids = order.expand_as(kept)[kept].view(len(target_probs), -1)  # (n + 1, K)
    probs = target_probs.gather(1, ids)  # (n + 1, K)
    return verify_stochastic(draft, draft_probs, probs, generator, target_ids=ids)


@pytest.mark.slow
@pytest.mark.parametrize("k, deterministic", [(3, False), (2, True)])
def test_stochastic_verification_over_candidates_keeps_the_target_distribution(k, deterministic):
    """The same chi-square test with the target's distributions handed over as candidate ids and probabilities,
    one token of each row outside the candidates (probability 0), so a rejected draft's residual is sampled over
    the candidates alone."""
    truncated = TARGET.clone()
    truncated[torch.arange(VOCAB), (torch.arange(VOCAB) + 1) % VOCAB] = 0.0  # (V, V): one impossible next token
    target = truncated / truncated.sum(-1, keepdim=True)
    assert chi_square_p_value(candidate_verifier, k, deterministic, target=target) > 1e-3
