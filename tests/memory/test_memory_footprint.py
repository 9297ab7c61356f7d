"""The footprint model counts, from shapes alone, exactly the bytes the engine then allocates."""

from __future__ import annotations

import pytest

from tests.conftest import FAMILIES
from edge import Engine
from edge.memory.budget import BudgetError, format_size, parse_size
from edge.memory.device import probe
from edge.memory.footprint import footprint


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_and_kv_match_what_the_engine_allocates(checkpoint_factory, family, dtype):
    engine = Engine.load(checkpoint_factory(family), dtype=dtype, max_context=96)
    shape = engine.model.config.shape()
    allocated = engine.memory_footprint()
    assert shape.weight_bytes(dtype) == allocated["weights"]
    assert shape.kv_bytes(96, dtype) == allocated["kv_cache"] == engine.cache.nbytes


@pytest.mark.parametrize("spec", ["ngram", "early-exit:1", "skip:1", "adaptive"])
def test_drafters_without_weights_hold_nothing_extra(llama_dir, spec):
    engine = Engine.load(llama_dir, max_context=64, drafter=spec)
    shape = engine.model.config.shape()
    planned = footprint(shape, 64, drafter=None, draft_length=4)
    assert planned.drafter_weights == planned.draft_kv == 0 == engine.memory_footprint()["drafter"]


def test_a_draft_model_holds_its_weights_and_its_own_cache(checkpoint_factory, tokenizer_dir, tmp_path):
    from tests.conftest import build_checkpoint

    draft_dir = build_checkpoint(tmp_path / "draft", "llama3", tokenizer_dir, num_hidden_layers=1)
    engine = Engine.load(checkpoint_factory("llama3"), max_context=80, drafter=f"draft:{draft_dir}")
    planned = footprint(engine.model.config.shape(), 80, drafter=engine.drafter.model.config.shape(), draft_length=4)
    assert planned.drafter_weights + planned.draft_kv == engine.memory_footprint()["drafter"]
    assert planned.target_weights + planned.target_kv == engine.memory_footprint()["weights"] + engine.cache.nbytes


@pytest.mark.parametrize("kv_cache", ["int8", "int8-int4", "hierarchical"])
def test_quantized_kv_matches_what_the_engine_allocates(llama_dir, kv_cache):
    engine = Engine.load(llama_dir, max_context=96, kv_cache=kv_cache)
    assert engine.model.config.shape().kv_bytes(96, kv_cache) == engine.memory_footprint()["kv_cache"]


def test_quantized_and_half_precision_kv_scale_as_expected(llama_dir):
    shape = Engine.load(llama_dir, max_context=32).model.config.shape()  # head_dim 16
    full = shape.kv_bytes(1000, "float32")
    assert shape.kv_bytes(1000, "bfloat16") == full // 2
    assert shape.kv_bytes(1000, "int8") == full * (16 + 2) // 64  # codes plus a float16 scale per vector
    assert shape.kv_bytes(1000, "int4") == full * (8 + 2) // 64
    assert shape.weight_bytes("int4") < shape.weight_bytes("int8") < shape.weight_bytes("bfloat16")
    with pytest.raises(ValueError, match="unknown KV dtype"):
        shape.kv_bytes(10, "float8")


def test_trimmed_drafter_vocabulary_shrinks_the_buffers(llama_dir):
    shape = Engine.load(llama_dir, max_context=32).model.config.shape()
    full = footprint(shape, 512, drafter=shape, draft_length=4)
    trimmed = footprint(shape, 512, drafter=shape, draft_length=4, drafter_vocab=shape.vocab_size // 4)
    assert trimmed.draft_buffers < full.draft_buffers and trimmed.speculation < full.speculation


def test_budget_strings_and_the_device_probe():
    assert parse_size("6GiB") == 6 * 2**30 and parse_size("512 MiB") == 512 * 2**20 and parse_size("2GB") == 2e9
    for bad in ("lots", "-1GiB", "6 parsecs", "0"):
        with pytest.raises(BudgetError, match="memory size"):
            parse_size(bad)
    assert format_size(1536) == "1.5 KiB"
    measured = probe("cpu")
    assert 0 < measured.budget < measured.available <= measured.total
    assert probe("cpu", budget="1GiB").budget == 2**30 and probe("cpu", budget="1GiB").source == "--memory-budget"


def test_a_cgroup_limit_caps_the_probe(tmp_path):
    (tmp_path / "memory.max").write_text(str(3 * 2**30))
    (tmp_path / "memory.current").write_text(str(2**30))
    measured = probe("cpu", cgroup_root=tmp_path)
    assert measured.source == "cgroup v2" and measured.available == 2 * 2**30
    (tmp_path / "memory.max").write_text("max")
    assert probe("cpu", cgroup_root=tmp_path).source == "psutil"
