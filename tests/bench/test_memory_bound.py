"""bench.memory_bound: the built-in pair widened into memory-bound benchmark targets keeps its tokens."""

from __future__ import annotations

import json

import pytest
from tests.conftest import transformers_greedy
from tests.helpers import greedy

from edge import Engine
from bench import memory_bound
from edge.sources.builtin import builtin_drafter_path, builtin_model_path

pytestmark = pytest.mark.skipif(builtin_model_path() is None, reason="this checkout ships no built-in model")
PROMPT = [{"role": "user", "content": "Write a Python function that reverses a list."}]


@pytest.fixture(scope="module")
def widened(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory-bound")
    assert memory_bound.main([str(out), "--params", "16M", "--draft-params", "4M"]) == 0
    return out


def test_sizes_follow_the_flags(widened):
    for name, source, params in (("target", builtin_model_path(), 16e6), ("draft", builtin_drafter_path(), 4e6)):
        config = json.loads((widened / name / "config.json").read_text())
        base = json.loads((source / "config.json").read_text())
        assert config["intermediate_size"] > base["intermediate_size"] and config["intermediate_size"] % 64 == 0
        traffic = memory_bound.weight_traffic(config, config["intermediate_size"])
        assert params <= traffic < params * 1.05
        assert {k: v for k, v in config.items() if k != "intermediate_size"} == \
            {k: v for k, v in base.items() if k != "intermediate_size"}
        assert (widened / name / "tokenizer.json").is_file()


@pytest.mark.parametrize("weights", [None, "int8", "int4"])
def test_widened_target_decodes_the_builtin_models_tokens(widened, weights):
    widened_tokens = greedy(widened / "target", PROMPT, 24, weights=weights)
    assert widened_tokens == greedy(builtin_model_path(), PROMPT, 24, weights=weights)


def test_widened_draft_drafts_the_builtin_drafters_tokens(widened):
    assert greedy(widened / "draft", PROMPT, 24) == greedy(builtin_drafter_path(), PROMPT, 24)


def test_speculation_with_the_widened_pair_is_lossless(widened):
    plain = greedy(widened / "target", PROMPT, 24, weights="int8")
    assert greedy(widened / "target", PROMPT, 24, weights="int8", drafter=str(widened / "draft")) == plain


def test_transformers_loads_the_widened_target_and_agrees(widened):
    folder = widened / "target"
    engine = Engine.load(folder, max_context=256)
    prompt = engine.tokenizer.encode_chat(PROMPT)
    ours = [t for e in engine.generate(prompt, max_new_tokens=16, ignore_eos=True, temperature=0.0)
            for t in e.token_ids]
    assert ours == transformers_greedy(folder, prompt, 16)


def test_parameter_counts_parse_and_bad_ones_say_how():
    assert memory_bound.parse_count("500M") == 500_000_000 and memory_bound.parse_count("1.5B") == 1_500_000_000
    with pytest.raises(SystemExit):
        memory_bound.main(["/tmp/unused", "--params", "lots"])
