"""bench.draft_ceiling: the draft's ranks of the target's tokens, the tokens a chain or tree of them would accept, and
the whole tool on a tiny model drafting for itself."""

from __future__ import annotations

import pytest
import torch

from bench import draft_ceiling


def test_a_rank_is_the_place_of_the_wanted_token_among_the_drafts_choices():
    head = torch.eye(6)  # (V', D): token i scores hidden[i]
    hidden = torch.tensor([[0.0, 5, 4, 3, 2, 1], [9, 0, 0, 0, 0, 0]])  # (T, D)
    assert draft_ceiling.draft_ranks(hidden, head, None, [2, 0]) == [1, 0]
    assert draft_ceiling.draft_ranks(hidden, head, None, [0, 0]) == [draft_ceiling.RANKS, 0]  # 5th choice: not kept
    kept = torch.tensor([10, 11, 12, 13, 14, 15])  # the rows stand for these token ids
    assert draft_ceiling.draft_ranks(hidden, head, kept, [13, 7]) == [2, draft_ceiling.RANKS]  # 7: not in the head


def test_a_chain_accepts_up_to_its_first_miss_and_a_branch_where_the_chain_missed():
    shares = draft_ceiling.prefix_shares([[0, 0, 1, 0]])  # four start positions
    assert shares[(0,)] == pytest.approx(3 / 4) and shares[(0, 0)] == pytest.approx(1 / 4)
    assert shares[(1,)] == pytest.approx(1 / 4) and shares[(0, 1)] == pytest.approx(1 / 4)
    chain = [(0,), (0, 0), (0, 0, 0)]
    assert draft_ceiling.expected_tokens(chain, shares) == pytest.approx(1 + 3 / 4 + 1 / 4)
    assert draft_ceiling.expected_tokens(chain[:2] + [(0, 1)], shares) == pytest.approx(1 + 3 / 4 + 1 / 4 + 1 / 4)


def test_a_step_costs_its_verify_rows_and_a_draft_call_per_depth():
    c = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}
    assert draft_ceiling.step_cost([(0,), (0, 0)], c, 0.25) == pytest.approx(1.2 + 2 * 0.25)
    tree = [(0,), (1,), (0, 0)]  # depth 1 drafted from the root; depth 2 from one node
    assert draft_ceiling.step_cost(tree, c, 0.25) == pytest.approx(1.3 + 0.25 + 0.25)
    assert draft_ceiling.step_cost([(0,), (1,), (0, 0), (1, 0)], c, 0.25) is None  # 5 rows: not measured


def test_trees_of_the_likeliest_paths_keep_each_path_after_its_prefix():
    shares = draft_ceiling.prefix_shares([[0, 1, 0, 2, 0, 0, 1, 0]])
    for name, tree in draft_ceiling.shapes(shares, 5):
        assert all(len(path) == 1 or path[:-1] in tree[:index] for index, path in enumerate(tree)), name


def test_a_model_drafting_for_itself_has_every_first_choice_right(llama_dir, capsys):
    assert draft_ceiling.main([str(llama_dir), str(llama_dir), "--max-new-tokens", "12", "--rows", "3",
                               "--repeats", "1", "--context", "16"]) == 0
    out = capsys.readouterr().out
    assert "top-1 100.0%" in out
    assert "| chain of 2 | 3 |" in out and "best: " in out and "a drafted token for 1.8x" in out


def test_the_draft_cost_asked_for_a_goal_gives_that_bound():
    c = {1: 1.0, 2: 1.1, 3: 1.2}
    tree, tokens = [(0,), (0, 0)], 2.5
    needed = draft_ceiling.draft_ratio_for(1.5, tree, tokens, c)
    assert tokens / draft_ceiling.step_cost(tree, c, needed) == pytest.approx(1.5)
    assert draft_ceiling.draft_ratio_for(3.0, tree, tokens, c) < 0  # beyond what free drafting gives
