"""The memory plan: what fits a budget, the step-downs taken in order, and an engine sized by it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from edge import Engine
from edge.model.config import ModelConfig
from edge.memory.budget import BudgetError, format_size
from edge.memory.plan import PlanRequest, make_plan

MiB = 2**20


@pytest.fixture(scope="module")
def shapes(checkpoint_factory, tokenizer_dir, tmp_path_factory):
    from tests.conftest import build_checkpoint

    target = ModelConfig.from_dir(checkpoint_factory("llama3")).shape()
    draft_dir = build_checkpoint(tmp_path_factory.mktemp("draft"), "llama3", tokenizer_dir, num_hidden_layers=1)
    return target, ModelConfig.from_dir(draft_dir).shape(), draft_dir


def request(shapes, **changes):
    target, draft, _ = shapes
    return PlanRequest(**{"target": target, "context": 512, "drafter": "model", "drafter_shape": draft,
                          "draft_length": 8, "min_context": 64, **changes})


def test_a_roomy_budget_takes_no_step_down(shapes):
    plan = make_plan(request(shapes), 1 << 30)
    assert (plan.max_context, plan.drafter, plan.steps) == (512, "model", [])
    assert plan.fits and json.loads(json.dumps(plan.to_dict()))["footprint"]["total"] == plan.footprint.total


def test_step_downs_come_in_order_with_reasons(shapes):
    full = make_plan(request(shapes), 1 << 30)
    # between the plain model's minimum and the n-gram lower bound: the draft model and speculation both go
    ngram_floor = make_plan(request(shapes, drafter="ngram", drafter_shape=None), 1 << 30).lower_bound
    plan = make_plan(request(shapes), full.minimum + (ngram_floor - full.minimum) // 2)
    assert plan.drafter == "none" and plan.max_context < 512
    assert [step.split(":")[0] for step in plan.steps][:3] == [
        "draft context 512 -> 256 tokens", "draft model -> n-gram drafter", "speculation off"]
    assert all("context" in step for step in plan.steps[3:])
    # just above the requested speculation's lower bound: speculation stays, the context shrinks
    kept = make_plan(request(shapes), full.lower_bound + 1)
    assert kept.drafter == "model" and kept.max_context == 64 and kept.footprint.total <= full.lower_bound + 1


def test_a_shorter_draft_context_comes_first(shapes):
    full = make_plan(request(shapes), 1 << 30)
    windowed = make_plan(request(shapes, draft_context=256), 1 << 30)
    assert windowed.footprint.draft_kv == full.footprint.draft_kv // 2
    plan = make_plan(request(shapes), windowed.footprint.total)  # fits only with the draft model's window
    assert (plan.drafter, plan.max_context, plan.draft_context) == ("model", 512, 256)
    assert [step.split(":")[0] for step in plan.steps] == ["draft context 512 -> 256 tokens"]


def test_the_engine_applies_the_drafter_step_downs(shapes, checkpoint_factory):
    target, draft, draft_dir = shapes
    model_dir = checkpoint_factory("llama3")
    roomy = Engine.load(model_dir, max_context=512, drafter=f"draft:{draft_dir}", memory_budget=1 << 30)
    plan = roomy.plan.footprint
    narrow = Engine.load(model_dir, max_context=512, drafter=f"draft:{draft_dir}", memory_budget=plan.total - 1)
    assert [step.split(":")[0] for step in narrow.plan.steps] == ["draft model weights float32 -> bfloat16"]
    assert narrow.drafter.model.embed.weight.dtype == torch.bfloat16 and narrow.drafter.model.dtype == torch.float32
    budget = plan.total - plan.drafter_weights // 2 - plan.draft_kv // 4  # the draft cache must shrink too
    quantized = Engine.load(model_dir, max_context=512, drafter=f"draft:{draft_dir}", memory_budget=budget)
    assert [step.split(":")[0] for step in quantized.plan.steps] == ["draft model weights float32 -> bfloat16",
                                                                     "draft KV cache float32 -> int8"]
    assert quantized.plan.draft_kv == "int8" and quantized.drafter.cache.formats == ("int8", "int8")
    budget = plan.total - plan.drafter_weights // 2 - plan.draft_kv * 4 // 5  # and be shorter
    windowed = Engine.load(model_dir, max_context=512, drafter=f"draft:{draft_dir}", memory_budget=budget)
    assert [step.split(":")[0] for step in windowed.plan.steps] == ["draft model weights float32 -> bfloat16",
                                                                    "draft KV cache float32 -> int8",
                                                                    "draft context 512 -> 256 tokens"]
    assert windowed.plan.draft_context == 256 and windowed.drafter.cache.max_len == 256
    for engine in (narrow, quantized, windowed):  # what was allocated is what was planned, within the budget
        footprint = engine.plan.footprint
        assert engine.memory_footprint()["drafter"] == footprint.drafter_weights + footprint.draft_kv
        assert engine.memory_footprint()["total"] <= engine.plan.budget
    plain = Engine.load(model_dir, max_context=512)
    for engine in (narrow, quantized, windowed):  # lossless whatever the drafter's precision and window
        plain.reset(), engine.reset()
        expected = [t for e in plain.generate("The quick brown", max_new_tokens=64, temperature=0.0, ignore_eos=True)
                    for t in e.token_ids]
        assert [t for e in engine.generate("The quick brown", max_new_tokens=64, temperature=0.0, ignore_eos=True)
                for t in e.token_ids] == expected


def test_a_budget_below_the_minimum_names_it(shapes):
    plan = make_plan(request(shapes), 1 << 30)
    with pytest.raises(BudgetError, match=rf"cannot hold the model: it needs at least .* \({plan.minimum} bytes"):
        make_plan(request(shapes), plan.minimum - 1)


def test_a_budget_edge_cannot_plan_for_is_an_edge_error_with_the_planners_message(checkpoint_factory):
    from edge.errors import EdgeError, MemoryBudgetError
    from edge.planning import plan_for

    model_dir = checkpoint_factory("llama3")
    minimum = plan_for(model_dir, budget=1 << 30, max_context=512).minimum
    for load in (lambda: plan_for(model_dir, budget=minimum - 1, max_context=512),
                 lambda: Engine.load(model_dir, max_context=512, memory_budget=minimum - 1)):
        with pytest.raises(MemoryBudgetError, match=rf"cannot hold the model: it needs at least .* \({minimum} bytes"
                           ) as error:
            load()
        assert isinstance(error.value, EdgeError) and isinstance(error.value, ValueError)
        assert len(str(error.value).splitlines()) == 1
    with pytest.raises(MemoryBudgetError, match="cannot read the memory size 'lots'"):
        Engine.load(model_dir, memory_budget="lots")


def test_the_engine_allocates_what_the_plan_says(shapes, checkpoint_factory):
    target, draft, draft_dir = shapes
    model_dir = checkpoint_factory("llama3")
    roomy = Engine.load(model_dir, max_context=512, drafter=f"draft:{draft_dir}", memory_budget=1 << 30)
    assert roomy.plan.steps == [] and roomy.cache.max_len == 512
    assert roomy.plan.footprint.target_weights + roomy.plan.footprint.target_kv == (
        roomy.memory_footprint()["weights"] + roomy.memory_footprint()["kv_cache"])
    assert roomy.plan.footprint.drafter_weights + roomy.plan.footprint.draft_kv == roomy.memory_footprint()["drafter"]
    tight_budget = roomy.plan.minimum + (roomy.plan.lower_bound - roomy.plan.minimum) // 3
    tight = Engine.load(model_dir, max_context=512, drafter=f"draft:{draft_dir}", memory_budget=tight_budget)
    assert tight.plan.steps and tight.cache.max_len == tight.plan.max_context < 512
    assert tight.memory_footprint()["total"] <= tight_budget  # a plan is never exceeded
    assert "".join(e.text for e in tight.chat([{"role": "user", "content": "hi"}], max_new_tokens=8))


def test_edge_chat_plans_without_weights_and_reports_step_downs(checkpoint_factory, tmp_path, capsys):
    from edge.tui.cli import main as chat_main

    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(checkpoint_factory("llama3") / "config.json", config_only / "config.json")
    assert chat_main([str(config_only), "--plan", "--max-context", "512", "--memory-budget", "1GiB",
                      "--drafter", "ngram"]) == 0
    assert json.loads(capsys.readouterr().out)["drafter"] == "ngram"
    assert chat_main([str(config_only), "--plan", "--memory-budget", "lots"]) == 2
    err = capsys.readouterr().err
    assert "cannot read the memory size 'lots'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_chat_just_above_the_lower_bound_runs_and_says_what_it_gave_up(checkpoint_factory, shapes):
    model_dir = checkpoint_factory("llama3")
    _, _, draft_dir = shapes
    plan = Engine.load(model_dir, max_context=512, drafter=f"draft:{draft_dir}", memory_budget=1 << 30).plan
    budget = str(plan.lower_bound + 4096)
    done = subprocess.run([sys.executable, "-m", "edge.tui.cli", str(model_dir), "--max-context", "512", "--drafter",
                           f"draft:{draft_dir}", "--memory-budget", budget, "--prompt", "hello", "--max-new-tokens",
                           "6"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "memory plan: context 512 -> 256 tokens" in done.stderr and done.stdout.strip()


def test_planning_rejects_unknown_drafters_and_draft_lengths(checkpoint_factory):
    from edge.errors import SamplingError
    from edge.planning import plan_for

    model_dir = checkpoint_factory("llama3")
    with pytest.raises(SamplingError, match="unknown drafter 'bogus'"):
        plan_for(model_dir, budget="1GiB", max_context=128, drafter="bogus")
    with pytest.raises(SamplingError, match="draft length must be 'adaptive', 'adaptive:P' or a whole number"):
        plan_for(model_dir, budget="1GiB", max_context=128, drafter="ngram", draft_length="x")
    assert plan_for(model_dir, budget="1GiB", max_context=128, drafter="early-exit:1").drafter == "self"


def test_the_plan_reports_the_runtime_beside_the_model(checkpoint_factory):
    from edge.planning import plan_for

    plan = plan_for(checkpoint_factory("llama3"), budget="1GiB", max_context=128, drafter="ngram")
    assert plan.runtime_overhead > 50 * MiB  # the interpreter and torch, measured while planning
    assert plan.expected_peak == plan.runtime_overhead + plan.footprint.total
    assert json.loads(json.dumps(plan.to_dict()))["expected_peak"] == plan.expected_peak
    assert "runtime:" in plan.summary()


def test_a_quantspec_plan_counts_its_quantized_projections_and_the_hierarchical_cache(checkpoint_factory):
    engine = Engine.load(checkpoint_factory("llama3"), max_context=128, drafter="quantspec", memory_budget=1 << 30)
    plan = engine.plan
    assert plan.drafter == "quantspec" and plan.kv_dtype == "hierarchical"
    assert plan.footprint.drafter_weights == engine.drafter.memory_bytes() > 0
    assert plan.footprint.target_kv == engine.cache.nbytes and plan.footprint.draft_kv == 0


def test_the_builtin_feature_drafter_is_planned_like_a_small_draft_model():
    from edge.sources.builtin import builtin_feature_drafter_path, builtin_model_path

    if builtin_feature_drafter_path() is None:
        pytest.skip("this checkout ships no built-in feature drafter")
    engine = Engine.load(builtin_model_path(), max_context=512, drafter="feature", memory_budget="1GiB")
    assert engine.plan.drafter == "model" and engine.drafter.name == "feature"
    assert engine.plan.footprint.target_weights == engine.model.weight_bytes()  # float16 kept, counted as kept
    planned = engine.plan.footprint.drafter_weights + engine.plan.footprint.draft_kv
    # it counts the drafter's copy of the embedding, which edge shares, about as much as the feature buffer it omits
    assert 0.5 * planned <= engine.memory_footprint()["drafter"] <= 1.5 * planned


def test_slots_count_a_kv_cache_each_and_step_down_to_what_fits(shapes):
    target = shapes[0]
    one = make_plan(request(shapes, drafter="none", drafter_shape=None), 1 << 30)
    assert (one.slots, one.slot_bytes) == (1, 0)  # one reply at a time: the engine's own cache only
    auto = make_plan(request(shapes, drafter="none", drafter_shape=None, slots=None), 1 << 30)
    cache, buffers = target.kv_bytes(512), target.verify_buffer_bytes(128, 512)
    assert (auto.slots, auto.slot_bytes) == (4, 4 * cache + buffers) and auto.steps == []
    assert auto.total == auto.footprint.total + auto.slot_bytes and "4 slots" in auto.summary()
    budget = one.footprint.total + buffers + 2 * cache + cache // 2  # room for two caches, not three
    asked = make_plan(request(shapes, drafter="none", drafter_shape=None, slots=6), budget)
    assert (asked.slots, asked.max_context) == (2, 512) and asked.fits
    assert asked.steps == [f"slots 6 -> 2: 6 replies' KV caches of 512 tokens need "
                           f"{format_size(6 * cache + buffers)} beside the rest of the plan"]
    assert make_plan(request(shapes, drafter="none", drafter_shape=None, slots=None), budget).slots == 2
    alone = make_plan(request(shapes, drafter="none", drafter_shape=None, slots=None), one.footprint.total + cache)
    assert (alone.slots, alone.slot_bytes) == (1, 0)  # fewer than two fit: nothing more is allocated
