"""Bad input found by a new user's probe of a tiny checkpoint: a 172-wide MLP with the QuantSpec drafter and
quantized weights, and loading errors that must name the right file, the checkpoint's own tensor names, and a fix."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.conftest import build_checkpoint
from edge import Engine
from edge.errors import CheckpointError, EdgeError, TokenizerError
from edge.text.tokenizer import Tokenizer
from edge.kernels.quant import quantize_weight
from edge.tui.cli import main as chat_main

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture(scope="module")
def mlp172(tmp_path_factory, tokenizer_dir):
    """A llama whose MLP is 172 wide: neither 32 nor 64 divides it (4 does)."""
    return build_checkpoint(tmp_path_factory.mktemp("mlp172"), "llama2", tokenizer_dir, intermediate_size=172)


def tokens(engine: Engine, count: int = 16) -> list[int]:
    engine.reset()
    return [t for e in engine.generate(PROMPT, max_new_tokens=count, ignore_eos=True, temperature=0.0) for t in e.token_ids]


def one_line(message: str, *needles: str) -> None:
    assert "\n" not in message.strip() and "Traceback" not in message, message
    for needle in needles:
        assert needle in message, message


# ---- finding 1: QuantSpec and quantized weights on a 172-wide MLP ----

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_quantspec_runs_on_a_172_wide_mlp_computing_in_16_bits(mlp172, dtype):
    """It ended in a traceback (the quantized KV cache handed float32 keys to bfloat16/float16 queries)."""
    engine = Engine.load(mlp172, dtype=dtype, max_context=128, drafter="quantspec", draft_length=3)
    events = list(engine.generate(PROMPT, max_new_tokens=16, ignore_eos=True, temperature=0.0))
    assert sum(len(e.token_ids) for e in events) == 16 and events[-1].stats.drafted > 0


@pytest.mark.parametrize("weights", [None, "int8", "int4"])
def test_quantspec_and_quantized_weights_on_a_172_wide_mlp_equal_plain_decoding(mlp172, weights):
    plain = Engine.load(mlp172, max_context=128, kv_cache="hierarchical", weights=weights)
    fast = Engine.load(mlp172, max_context=128, drafter="quantspec", draft_length=3, weights=weights)
    assert tokens(fast) == tokens(plain)


@pytest.mark.parametrize("spec", ["quantspec:3", "quantspec:16"])
def test_quantspec_bits_other_than_4_or_8_are_one_line(mlp172, capsys, spec):
    """quantspec:3 ended in a ValueError traceback from the quantizer."""
    assert chat_main([str(mlp172), "--drafter", spec, "--prompt", "hi"]) == 2
    one_line(capsys.readouterr().err, "edge-chat: error:", spec, "quantspec:4", "quantspec:8")
    with pytest.raises(EdgeError, match="4, 8"):
        Engine.load(mlp172, drafter=spec)


def test_the_group_size_advice_names_only_sizes_that_divide():
    with pytest.raises(ValueError) as error:
        quantize_weight(__import__("torch").zeros(8, 172), bits=4, group_size=32)
    advice = str(error.value).rpartition(":")[2]
    assert [int(size) for size in advice.split(",")] == [4, 2]


# ---- finding 3: the hint names the file at fault and the fix ----

@pytest.fixture()
def copy(llama_dir, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(llama_dir, folder)
    return folder


def load_error(folder) -> str:
    with pytest.raises(EdgeError) as error:
        Engine.load(folder)
    return str(error.value)


@pytest.mark.parametrize("text", ['{"architectures": ["LlamaForCausalLM"], ', "[1, 2]", "\udcff"])
def test_a_broken_config_json_names_config_json_not_the_tokenizer(copy, text):
    (copy / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    message = load_error(copy)
    one_line(message, "config.json", "download the checkpoint's config.json again")
    assert "tokenizer" not in message
    with pytest.raises(TokenizerError) as error:  # the tokenizer reads config.json's token ids too
        Tokenizer.from_dir(copy)
    one_line(str(error.value), "config.json", "download the checkpoint's config.json again")
    assert "re-save the tokenizer" not in str(error.value)


def test_a_config_value_of_the_wrong_type_is_one_line(copy):
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "hidden_size": "64"}))
    one_line(load_error(copy), "config.json", "hidden_size", "'64'")


def test_an_empty_folder_is_missing_config_json_first(tmp_path, capsys):
    one_line(load_error(tmp_path), "config.json")
    assert chat_main([str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    one_line(err, "config.json")
    assert "tokenizer" not in err


def test_config_without_weights_or_tokenizer_is_missing_the_weights(llama_dir, tmp_path):
    shutil.copy(llama_dir / "config.json", tmp_path / "config.json")
    message = load_error(tmp_path)
    one_line(message, "model.safetensors")
    assert "tokenizer" not in message


def test_a_wrong_shape_names_the_checkpoint_tensor_and_both_shapes(copy):
    tensors = load_file(copy / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    rows, columns = tensors[name].shape
    tensors[name] = tensors[name][:, : columns // 2].contiguous()
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as error:
        Engine.load(copy)
    one_line(str(error.value), repr(name), str((rows, columns // 2)), str((rows, columns)), "config.json")
    assert "wqkv" not in str(error.value)


def test_a_wrong_shape_in_the_mlp_names_its_own_tensor(copy):
    tensors = load_file(copy / "model.safetensors")
    name = "model.layers.2.mlp.up_proj.weight"
    tensors[name] = tensors[name][:-8].contiguous()
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    one_line(load_error(copy), repr(name), str(tuple(tensors[name].shape)))


@pytest.mark.parametrize("budget", [None, "1GB"])
def test_a_config_claiming_a_billion_layers_is_one_line_before_anything_is_built(llama_dir, tmp_path, budget):
    """It built names, shapes and modules for each claimed layer: 10 GB resident and climbing after two minutes."""
    folder = tmp_path / "ckpt"
    shutil.copytree(llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 10**9
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as raised:
        Engine.load(folder, memory_budget=budget)
    one_line(str(raised.value), "num_hidden_layers 1,000,000,000, but the weights hold 3 layers", "config.json")
