"""Accept or reject drafted tokens: the pure functions at the heart of lossless speculative decoding.

Given n drafted tokens and the target's distributions at the n + 1 positions they were verified at:

    greedy:      accept draft[i] while it equals the target's argmax at position i; the first mismatch is
                 replaced by the argmax; if all n match, the argmax at position n is a bonus token.
    stochastic:  (Leviathan et al. 2023) accept draft[i] with probability min(1, p_target(x) / p_draft(x));
                 on the first rejection sample from normalise(max(0, p_target - p_draft)) and stop;
                 if all n are accepted, sample a bonus token from p_target at position n.

Either way the emitted tokens are distributed exactly as plain decoding from the target would emit them.
A drafter without probabilities (n-gram lookup) proposes deterministically: p_draft is one-hot on its token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafted tokens were accepted (0..n)
    next_token: int  # the target's token after them: a correction, or the bonus token when all were accepted

    def tokens(self, draft: list[int]) -> list[int]:
        return list(draft[: self.accepted]) + [self.next_token]


def verify_greedy(draft: list[int], target_choice: torch.Tensor) -> Verdict:
    """draft: n token ids; target_choice: (n + 1,) the target's greedy token at each verified position."""
    choices = target_choice.tolist()
    accepted = 0
    while accepted < len(draft) and draft[accepted] == choices[accepted]:
        accepted += 1
    return Verdict(accepted, choices[accepted])


def verify_stochastic(
    draft: list[int],
    draft_probs: torch.Tensor | None,  # (n, V) the drafter's sampling distributions, or None if deterministic
    target_probs: torch.Tensor,  # (n + 1, K) the target's sampling distributions (same transforms applied)
    generator: torch.Generator,
    target_ids: torch.Tensor | None = None,  # (n + 1, K) the token id of each column; None: K = V, column = id
) -> Verdict:
    """Stochastic verification. With `target_ids`, each row of target_probs is the distribution over its row of
    candidate ids (every other token has probability 0: a top-k sampler's handful), and the work per position is
    O(K) instead of O(V); the residual max(0, p_target - p_draft) is zero outside the target's candidates too."""
    n = len(draft)
    if n:
        index = torch.tensor(draft, device=target_probs.device)[:, None]  # (n, 1)
        if target_ids is None:
            p_target = target_probs[:n].gather(1, index)[:, 0]  # (n,)
        else:
            p_target = (target_probs[:n] * (target_ids[:n] == index)).sum(1)  # (n,): 0 where not a candidate
        p_draft = torch.ones_like(p_target) if draft_probs is None else draft_probs.gather(1, index)[:, 0]
        ratio = (p_target / p_draft.clamp_min(1e-20)).clamp(max=1.0)  # (n,)
        uniform = torch.rand(n, generator=generator, device=ratio.device)  # (n,)
        rejected = (uniform >= ratio).nonzero()
        if rejected.numel():
            first = int(rejected[0, 0])
            ids = target_ids[first] if target_ids is not None else None  # (K,) or None
            if draft_probs is None:
                q = _one_hot(draft[first], target_probs.shape[1], target_probs) if ids is None else \
                    (ids == draft[first]).to(target_probs.dtype)
            else:
                q = draft_probs[first] if ids is None else draft_probs[first][ids]  # (K,)
            residual = (target_probs[first] - q).clamp_min(0.0)  # (K,)
            total = residual.sum()
            # a zero residual means p_target == p_draft, where rejection has probability 0: fall back to p_target
            choice = residual / total if total > 0 else target_probs[first]
            return Verdict(first, _token(torch.multinomial(choice, 1, generator=generator), ids))
    bonus = torch.multinomial(target_probs[n], 1, generator=generator)
    return Verdict(n, _token(bonus, target_ids[n] if target_ids is not None else None))


def _token(column: torch.Tensor, ids: torch.Tensor | None) -> int:
    """The token id of a sampled column (1,): itself, or its candidate's id."""
    return int(column) if ids is None else int(ids[int(column)])


def _one_hot(token: int, size: int, like: torch.Tensor) -> torch.Tensor:
    vector = torch.zeros(size, dtype=like.dtype, device=like.device)
    vector[token] = 1.0
    return vector
