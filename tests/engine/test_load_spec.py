"""The one load spec: the command line, the chat app's settings and the API reach the same spec for the same choices,
the planner plans what the load uses, and each drifted option now reaches the load."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from tests.conftest import build_checkpoint
from edge import Engine
from edge.decoding.registry import KINDS, DrafterSpec
from edge.errors import CheckpointError, EdgeError, SamplingError
from edge.load_spec import DraftModelOptions, LoadSpec
from edge.model.packed_weights import packed_format
from edge.tui import cli
from edge.tui.settings import ChatSettings

CHOICES = {  # one choice for every option a user can set, as the command line spells it and as the API does
    "--dtype": ("dtype", "bfloat16"),
    "--weights": ("weights", "int8"),
    "--kv-cache": ("kv_cache", "int8-int4"),
    "--backend": ("backend", "torch"),
    "--max-context": ("max_context", 512),
    "--memory-budget": ("memory_budget", "2GiB"),
    "--drafter": ("drafter", "hybrid:early-exit:1"),
    "--draft-length": ("draft_length", "adaptive:0.3"),
    "--draft-context": ("draft_context", 64),
    "--draft-weights": ("draft_weights", "int4"),
    "--draft-kv": ("draft_kv", "int8"),
}


def test_the_command_line_the_app_settings_and_the_api_make_the_same_spec(llama_dir):
    argv = [str(llama_dir)] + [str(part) for flag, (_, value) in CHOICES.items() for part in (flag, value)]
    args = cli.build_parser().parse_args(argv)
    from_cli = cli.load_spec(args, cli.default_drafter(args))
    from_api = LoadSpec.from_options(llama_dir, **{name: value for name, value in CHOICES.values()})
    assert from_cli == from_api
    assert from_api.draft == DraftModelOptions(64, "int4", "int8")
    assert str(from_api.drafter) == "hybrid:early-exit:1" and from_api.draft_length == "adaptive:0.3"
    loader = cli.app_loader(args, from_cli)
    assert loader.spec == from_api
    assert loader.settings.applied_to(from_api) == from_api  # the app's drafter and draft length: the spec's own
    loaded = ("memory_budget", "weights")  # a budget is planned (below); int8 weights compute in float32
    engine = Engine.load(llama_dir, **{name: value for name, value in CHOICES.values() if name not in loaded})
    assert engine.spec == from_api.replace(memory_budget=None, weights=None)  # every other option reached it
    assert engine.drafter.name.startswith("hybrid:") and engine.draft_length.stop_below == 0.3


def test_plan_prints_the_plan_the_load_uses_with_a_quantized_kv_cache(llama_dir):
    options = ["--kv-cache", "int8", "--memory-budget", "1GiB", "--max-context", "512", "--drafter", "ngram"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main([str(llama_dir), "--plan", *options]) == 0
    printed = json.loads(out.getvalue())
    loaded = Engine.load(llama_dir, kv_cache="int8", memory_budget="1GiB", max_context=512, drafter="ngram").plan
    measured = ("runtime_overhead", "expected_peak")  # the process's own memory, measured as each plan is made
    assert printed["kv_dtype"] == "int8"
    assert {k: v for k, v in printed.items() if k not in measured} == \
        {k: v for k, v in loaded.to_dict().items() if k not in measured}


def test_the_app_settings_take_every_draft_length_the_command_line_takes(llama_dir):
    for length in ("adaptive", "adaptive:0.3", "5"):
        assert ChatSettings(drafter="ngram", draft_length=length).check().draft_length == length
    for bad in ("adaptive:2", "0", "fast"):
        with pytest.raises(SamplingError, match="draft length"):
            ChatSettings(draft_length=bad).check()
    engine = Engine.load(llama_dir, max_context=256)
    ChatSettings(drafter="ngram", draft_length="adaptive:0.3").applied_to(engine.spec)
    engine.use_drafter("ngram", "adaptive:0.3")
    assert engine.draft_length.stop_below == 0.3 and engine.spec.draft_length == "adaptive:0.3"


def test_the_onnx_path_refuses_what_it_cannot_honour_and_keeps_the_draft_models_options(llama_dir, tmp_path,
                                                                                         tokenizer_dir, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(CheckpointError, match="--kv-cache"):
        Engine.load(llama_dir, backend="onnx", kv_cache="int8")
    with pytest.raises(CheckpointError, match="--backend onnx"):
        Engine.load(llama_dir, backend="onnx", memory_budget="1GiB")
    assert not (tmp_path / "cache").exists()  # refused before any export
    draft = build_checkpoint(tmp_path / "draft", "llama3", tokenizer_dir, seed=5, num_hidden_layers=1)
    engine = Engine.load(llama_dir, max_context=256, backend="onnx", drafter=f"draft:{draft}", draft_length=3,
                         draft_weights="int8", draft_kv="int8")
    # the draft model runs on torch beside the exported target, with the weights and cache asked for
    assert engine.backend == "onnx" and packed_format(engine.drafter.model) == "int8"
    assert engine.drafter.cache.__class__.__name__ == "QuantizedKVCache"
    plain = Engine.load(engine.bundle.root, max_context=256)
    prompt = "The quick brown fox"
    assert engine.complete(prompt, max_new_tokens=32, ignore_eos=True, temperature=0.0) == \
        plain.complete(prompt, max_new_tokens=32, ignore_eos=True, temperature=0.0)


def test_drafter_specs_are_parsed_in_one_place_with_one_message(tmp_path):
    spec = DrafterSpec.parse("hybrid:early-exit:3@vocab.json")
    assert (spec.kind, spec.argument, spec.hybrid, spec.vocabulary) == ("early-exit", "3", True, "vocab.json")
    assert str(spec) == "hybrid:early-exit:3@vocab.json"
    assert DrafterSpec.parse(str(tmp_path)) == DrafterSpec("draft", str(tmp_path))  # a bare folder: a draft model
    assert DrafterSpec.parse("none") is None and DrafterSpec.parse(None) is None
    for bad in ("bogus", "ngram:x", "draft:", "adaptive:3", "early-exit:1,2", "skip:1,x"):
        with pytest.raises(SamplingError) as error:
            DrafterSpec.parse(bad)
        assert bad in str(error.value) and ("ngram[:N]" in str(error.value) or "the form is" in str(error.value))
    assert {kind.plan for kind in KINDS.values()} == {"ngram", "self", "quantspec", "model"}


def test_bad_load_options_name_the_option(llama_dir):
    for options, message in (({"weights": "int2"}, "weights .int2.: choose one of"), ({"kv_cache": "int3"}, "KV cache"),
                             ({"draft_weights": "fp8"}, "draft weights"), ({"max_context": 1}, "max_context"),
                             ({"backend": "tensorrt"}, "backend"), ({"draft_vocab": "v.json"}, "pass a drafter")):
        with pytest.raises(EdgeError, match=message):
            LoadSpec.from_options(llama_dir, **options)
    with pytest.raises(TypeError, match="unknown load option 'colour'"):
        Engine.load(llama_dir, colour="blue")
