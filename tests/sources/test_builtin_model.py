"""The built-in default model shipped in the package: loads, answers, and matches transformers token for token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from tests.conftest import transformers_greedy

from edge import Engine
from edge.sources.builtin import (builtin_deep_feature_drafter_path, builtin_drafter_path, builtin_feature_drafter_path,
                          builtin_model_path)

GOLDEN = Path(__file__).parent / "golden" / "builtin_greedy.json"
pytestmark = pytest.mark.skipif(builtin_model_path() is None, reason="this checkout ships no built-in model")


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(builtin_model_path(), max_context=1024)


def test_shipped_files_are_small_half_precision_safetensors():
    total = 0
    for folder in (builtin_model_path(), builtin_drafter_path(), builtin_feature_drafter_path(),
                   builtin_deep_feature_drafter_path()):
        config = json.loads((folder / "config.json").read_text())
        assert config.get("torch_dtype", config.get("dtype")) == "float16"
        assert (folder / "model.safetensors").is_file()
        assert (folder / "tokenizer.json").is_file() or config.get("edge_drafter") == "feature"
        assert not list(folder.glob("*.bin"))
        total += sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    assert total < 60e6


def test_golden_greedy_output(engine):
    golden = json.loads(GOLDEN.read_text())
    for case in golden:
        events = list(engine.chat(case["messages"], max_new_tokens=case["max_new_tokens"], temperature=0.0, loop_stop=0))
        assert [t for e in events for t in e.token_ids] == case["token_ids"]
        assert "".join(e.text for e in events) == case["text"]


@pytest.mark.slow
def test_transformers_loads_the_shipped_checkpoint_and_agrees(engine):
    folder = builtin_model_path()
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "What does the `json` module do?"}])
    ours = [t for e in engine.generate(prompt, max_new_tokens=48, ignore_eos=True, temperature=0.0) for t in e.token_ids]
    assert ours == transformers_greedy(folder, prompt, 48)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Hi"}]
    assert hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        engine.tokenizer.apply_chat_template(messages)


def test_builtin_drafter_speculation_is_lossless(engine):
    messages = [{"role": "user", "content": "Write a Python function `flatten(items)` that flattens a nested list."}]
    plain = [t for e in engine.chat(messages, max_new_tokens=64, temperature=0.0) for t in e.token_ids]
    fast = Engine.load(builtin_model_path(), max_context=1024, drafter="builtin")
    assert [t for e in fast.chat(messages, max_new_tokens=64, temperature=0.0) for t in e.token_ids] == plain


@pytest.mark.parametrize("folder", [None, builtin_deep_feature_drafter_path()], ids=["one layer", "two layers"])
def test_builtin_feature_drafters_are_lossless_and_draft_well(engine, folder):
    messages = [{"role": "user", "content": "Write a Python function `flatten(items)` that flattens a nested list."}]
    plain = [t for e in engine.chat(messages, max_new_tokens=64, temperature=0.0) for t in e.token_ids]
    drafter = "feature" if folder is None else f"feature:{folder}"
    fast = Engine.load(builtin_model_path(), max_context=1024, drafter=drafter, draft_length=3)
    events = list(fast.chat(messages, max_new_tokens=64, temperature=0.0))
    assert [t for e in events for t in e.token_ids] == plain
    stats = events[-1].stats
    # greedy and seeded by nothing: the same count every run; a drafter that lost its training would fall far below
    assert stats.accepted / stats.drafted > 0.4, (stats.accepted, stats.drafted)
