"""Layer offload: offloaded layers stream from host memory through two staging blocks and compute the same thing;
the memory planner offloads (on a GPU) only as its last step-down. On this CPU-only machine the streaming runs with
plain copies, which checks the bookkeeping; the GPU overlap is checked where a GPU is lent
(docs/history/benchmarks-2026-11-21.md)."""

from __future__ import annotations

import pytest

from tests.conftest import build_checkpoint
from edge import Engine
from edge.memory.budget import BudgetError
from edge.memory.plan import PlanRequest, make_plan
from tests.helpers import greedy


@pytest.fixture(scope="module")
def six_layers(tmp_path_factory, tokenizer_dir):
    return build_checkpoint(tmp_path_factory.mktemp("six"), "llama3", tokenizer_dir, num_hidden_layers=6)


@pytest.mark.slow
def test_offloaded_layers_compute_the_same_tokens(six_layers):
    plain = Engine.load(six_layers, max_context=128)
    offloaded = Engine.load(six_layers, max_context=128, offload_layers=[2, 3, 4, 5])
    assert greedy(offloaded) == greedy(plain)
    layer = plain.model.config.shape().layer_bytes()
    streamer = offloaded.model.streamer
    assert streamer.host_bytes() == 4 * layer  # on the host
    # on the device: everything but the four offloaded layers, plus two staging layers
    assert offloaded.memory_footprint()["weights"] == plain.memory_footprint()["weights"] - 4 * layer + 2 * layer
    for drafter in ("early-exit:2", "ngram", "skip:3"):  # early exits below the offloaded layers never wait
        fast = Engine.load(six_layers, max_context=128, offload_layers=[2, 3, 4, 5], drafter=drafter, draft_length=3)
        assert greedy(fast) == greedy(plain), drafter


def test_bad_offload_requests_are_refused(six_layers):
    with pytest.raises(ValueError, match="cannot offload layer 9"):
        Engine.load(six_layers, offload_layers=[9])


def test_the_planner_offloads_last_and_only_where_it_can(six_layers):
    from edge.model.config import ModelConfig

    shape = ModelConfig.from_dir(six_layers).shape()
    request = PlanRequest(target=shape, context=512, drafter="ngram", draft_length=4, min_context=64,
                          can_offload=True)
    roomy = make_plan(request, 1 << 30)
    assert roomy.offloaded_layers == [] and roomy.footprint.host_weights == 0
    tight = make_plan(request, roomy.minimum - 1)  # below the plain model at the shortest context
    assert tight.offloaded_layers and tight.offloaded_layers[-1] == shape.num_layers - 1  # the last layers go
    assert tight.footprint.total <= roomy.minimum - 1 and tight.max_context == 64
    assert tight.steps[-1].startswith(f"offload {len(tight.offloaded_layers)} of 6 layers to host memory")
    with pytest.raises(BudgetError, match="cannot hold the model: it needs at least"):
        make_plan(PlanRequest(target=shape, context=512, min_context=64), roomy.minimum - 1)  # a CPU: no offload
    with pytest.raises(BudgetError, match="even with every layer offloaded"):
        make_plan(request, 1000)


def test_quantspec_quantizes_offloaded_layers_from_their_host_copies(six_layers):
    plain = Engine.load(six_layers, max_context=128, kv_cache="hierarchical")
    fast = Engine.load(six_layers, max_context=128, offload_layers=[3, 4, 5], drafter="quantspec", draft_length=3)
    assert greedy(fast) == greedy(plain)
    assert fast.model.streamer.host_bytes() > 0
