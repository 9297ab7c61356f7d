"""Token trees: one verify pass over several candidate continuations (edge/decoding/speculative.py,
edge/kernels/csrc/attention.c). Each row of a tree computes exactly what decode steps along its path compute, the accepted
path's keys/values are moved into place, and greedy speculation with trees equals plain decoding."""

from __future__ import annotations

import pytest
import torch

import edge.engine.reply
from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.model.kernel_glue import verifies_trees
from edge.model.kv_cache import KVCache
from edge.model.transformer import keep_rows
from edge.sources.loading import load_model
from edge.model.quantized_kv_cache import QuantizedKVCache
from edge.decoding.drafters.base import runner_up_branches
from edge.decoding.speculative import SpeculativeDecoding, StepCosts
from edge.kernels import cpu_paths
from tests.helpers import greedy

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


def new_cache(model, kind: str):
    if kind == "hierarchical":
        return QuantizedKVCache.for_model(model.config, 64, key_format="hierarchical", value_format="hierarchical")
    return KVCache.for_model(model.config, 64)


@pytest.mark.parametrize("path", cpu_paths.runnable_paths())
@pytest.mark.parametrize("weights, kv_cache", [("float32", "float32"), ("int8", "float32"), ("int4", "hierarchical")])
def test_each_path_of_a_tree_computes_what_decode_steps_compute(llama_dir, monkeypatch, path, weights, kv_cache):
    from edge.model.packed_weights import quantize_weights

    monkeypatch.setenv("EDGE_CPU_KERNEL", path)
    model = load_model(llama_dir)
    if weights != "float32":
        quantize_weights(model, weights)
    tokens = torch.randint(0, model.config.vocab_size, (1, 26), generator=torch.Generator().manual_seed(5))
    prompt, (r, a, b, c, x, y) = tokens[:, :20], tokens[0, 20:].tolist()
    #        rows: 0  1  2  3  4  5     two continuations of r: a b c, and x y
    tree_tokens, parents = [r, a, b, c, x, y], [-1, 0, 1, 2, 0, 4]
    tree_cache, chain_cache = new_cache(model, kv_cache), new_cache(model, kv_cache)
    with torch.inference_mode():
        for cache in (tree_cache, chain_cache):
            model.forward_logits(prompt, 0, cache)
        assert verifies_trees(model, tree_cache, 6)
        tree = model.forward_logits(torch.tensor([tree_tokens]), 20, tree_cache, parents=parents)[0]  # (6, V)
        for rows in ([0, 1, 2, 3], [0, 4, 5]):  # each path, as decode steps from the prompt
            chain_cache.rollback(20)
            steps = torch.cat([model.forward_logits(torch.tensor([[tree_tokens[row]]]), 20 + i, chain_cache)[0]
                               for i, row in enumerate(rows)])
            assert torch.equal(tree[rows], steps), rows
        keep_rows(model, 20, [0, 4, 5], tree_cache)  # accept r x y: the cache now holds the prompt and r x y
        assert tree_cache.length == chain_cache.length == 23
        after_tree = model.forward_logits(torch.tensor([[a]]), 23, tree_cache)
        after_steps = model.forward_logits(torch.tensor([[a]]), 23, chain_cache)
    assert torch.equal(after_tree, after_steps)


def _forced_trees(monkeypatch) -> list[SpeculativeDecoding]:
    """Give every drafted position a runner-up, whatever it costs; return the strategies the engine makes."""
    monkeypatch.setattr(StepCosts, "tree_branches", lambda self, confidences, reaches: len(reaches))
    made = []

    class Recorded(SpeculativeDecoding):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(edge.engine.reply, "SpeculativeDecoding", Recorded)
    return made


@pytest.mark.parametrize("drafter, weights, kv_cache", [("early-exit:1", None, "float32"),
                                                        ("early-exit:1", "int8", "float32"),
                                                        ("quantspec", None, "hierarchical")])
def test_greedy_speculation_with_token_trees_equals_plain_decoding(llama_dir, monkeypatch, drafter, weights, kv_cache):
    plain = Engine.load(llama_dir, max_context=256, weights=weights, kv_cache=kv_cache)
    expected = [greedy(plain, prompt, 60) for prompt in (PROMPT, "import os\nfor name in")]
    made = _forced_trees(monkeypatch)
    fast = Engine.load(llama_dir, max_context=256, weights=weights, kv_cache=kv_cache, drafter=drafter)
    assert [greedy(fast, prompt, 60) for prompt in (PROMPT, "import os\nfor name in")] == expected
    assert made[-1].sampler.trees and sum(s.tree_rows for s in made) > 0


@pytest.mark.slow
def test_trees_on_the_builtin_model_keep_the_output_and_accept_runners_up(monkeypatch):
    plain = Engine.load(builtin_model_path())
    prompts = ["def fibonacci(n):", "Once upon a time there was", "The capital of"]
    expected = [greedy(plain, prompt, 80) for prompt in prompts]
    made = _forced_trees(monkeypatch)
    for drafter in ("feature", "builtin"):
        fast = Engine.load(builtin_model_path(), drafter=drafter)
        assert [greedy(fast, prompt, 80) for prompt in prompts] == expected, drafter
    assert sum(s.tree_accepted for s in made) > 0  # some runner-up was the target's token: the tree did its job


def test_sampled_and_fixed_length_decoding_draft_chains(monkeypatch):
    made = _forced_trees(monkeypatch)
    fast = Engine.load(builtin_model_path(), drafter="feature")
    list(fast.generate(PROMPT, max_new_tokens=24, temperature=0.8, seed=3))
    fixed = Engine.load(builtin_model_path(), drafter="feature", draft_length=3)
    list(fixed.generate(PROMPT, max_new_tokens=24, temperature=0.0))
    assert [s.sampler.trees for s in made] == [False, False] and sum(s.tree_rows for s in made) == 0


def test_runners_up_become_leaves_beside_the_chain_likeliest_first():
    branches = runner_up_branches([0.9, 0.5, 0.8], [(11, 0.05), (12, 0.4), (13, 0.1)])
    assert [(b.token, b.parent) for b in branches] == [(12, 0), (11, -1), (13, 1)]  # each beside chain token j
    assert [round(b.reach, 4) for b in branches] == [0.36, 0.05, 0.045]  # reached where the chain reaches j


def test_the_cost_model_adds_rows_only_where_they_pay():
    confidences, reaches = [0.9, 0.5, 0.8], [0.36, 0.05, 0.045]
    costs = StepCosts(draft_per_token=0.001)
    assert costs.tree_branches(confidences, reaches) == 0  # nothing measured yet
    costs.verify = {4: 0.030, 5: 0.031, 6: 0.031, 7: 0.031}  # memory-bound: a few more rows cost almost nothing
    assert costs.tree_branches(confidences, reaches) == 3
    costs.verify = {4: 0.030, 5: 0.060, 6: 0.090}  # compute-bound: every row costs a step
    assert costs.tree_branches(confidences, reaches) == 0
    costs.verify = {4: 0.030}  # one row beyond the measured is tried once (at the dearest cost below it), no more
    assert costs.tree_branches(confidences, reaches) == 1
    costs.verify = {4: 0.030, 5: 0.0305, 6: 0.045}  # the second branch is not worth its row, nor the third
    assert costs.tree_branches(confidences, reaches) == 1
