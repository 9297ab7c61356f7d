"""A model's recommended sampling: read from generation_config.json (or a GGUF file's general.sampling.* keys, which
a conversion writes there), and what a call without options starts from."""

from __future__ import annotations

import json
import shutil

from edge import Engine
from edge.engine import GenerationOptions
from edge.sources.sampling_config import gguf_generation_config, recommended_sampling


def test_generation_config_recommends_sampling_unless_it_says_do_sample_false(tmp_path):
    config = tmp_path / "generation_config.json"
    assert recommended_sampling(tmp_path) == {}  # no file
    config.write_text(json.dumps({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                  "repetition_penalty": 1.05, "eos_token_id": 2, "min_p": "high"}))
    assert recommended_sampling(tmp_path) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                              "repetition_penalty": 1.05}  # a value of the wrong type is left out
    config.write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert recommended_sampling(tmp_path) == {}
    config.write_text("not json")
    assert recommended_sampling(tmp_path) == {}


def test_a_gguf_files_sampling_keys_become_generation_config():
    metadata = {"general.sampling.temp": 0.6000000238418579, "general.sampling.top_k": 20,
                "general.sampling.top_p": 0.949999988079071, "general.sampling.penalty_last_n": 128,
                "general.sampling.min_p": -1.0, "general.name": "x"}
    assert gguf_generation_config(metadata) == {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                                "repeat_last_n": 128}
    assert gguf_generation_config({"general.name": "x"}) is None


def test_a_call_without_options_starts_from_the_models_recommendation(llama_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(llama_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 7}))
    engine = Engine.load(folder, max_context=64)
    assert engine.recommended == {"temperature": 0.6, "top_k": 7}
    options = GenerationOptions.merged(None, {"max_new_tokens": 4}, engine.recommended)
    assert (options.temperature, options.top_k, options.top_p, options.max_new_tokens) == (0.6, 7, 0.95, 4)
    greedy = GenerationOptions.merged(None, {"temperature": 0}, {**engine.recommended, "repetition_penalty": 1.2})
    assert greedy.greedy and greedy.penalty == 1.0  # greedy asked for: no penalty unless asked for too
    assert len([t for e in engine.generate("hello", max_new_tokens=4, ignore_eos=True, seed=1)
                for t in e.token_ids]) == 4
