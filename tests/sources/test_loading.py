"""Loading checkpoints: sharded files, memory mapping, and a one-line error for every kind of bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from tests.conftest import build_checkpoint
from edge.model.config import ModelConfig
from edge.errors import CheckpointError, UnsupportedModelError
from edge.model.kv_cache import KVCache
from edge.sources.loading import load_model


def copy_checkpoint(source, tmp_path):
    target = tmp_path / "ckpt"
    shutil.copytree(source, target)
    return target


def assert_one_line(error: Exception, *needles: str) -> None:
    message = str(error)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_sharded_checkpoint_loads_the_same_weights(llama_dir, tmp_path, tokenizer_dir):
    sharded = tmp_path / "sharded"
    transformers.AutoModelForCausalLM.from_pretrained(llama_dir).save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    one, many = load_model(llama_dir), load_model(sharded)
    for (name, a), (_, b) in zip(one.state_dict().items(), many.state_dict().items()):
        assert torch.equal(a, b), name


def test_weights_are_memory_mapped_views(llama_dir):
    model = load_model(llama_dir)
    # an unfused weight is a view of the file's map, not a private copy: its storage is not resizable
    assert not model.embed.weight.untyped_storage().resizable()
    ids = torch.tensor([[1, 2, 3]])
    model(ids, 0, KVCache.for_model(model.config, 4))  # and it computes


def test_pickled_checkpoint_is_refused(llama_dir, tmp_path):
    folder = tmp_path / "pickled"
    transformers.AutoModelForCausalLM.from_pretrained(llama_dir).save_pretrained(folder, safe_serialization=False)
    assert (folder / "pytorch_model.bin").is_file()
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "pytorch_model.bin", "pickle", "safe_serialization=True")


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(CheckpointError) as error:
        load_model(tmp_path / "nowhere")
    assert_one_line(error.value, "config.json")
    with pytest.raises(CheckpointError) as error:
        load_model(tmp_path)
    assert_one_line(error.value, "config.json")


def test_missing_weights(llama_dir, tmp_path):
    folder = copy_checkpoint(llama_dir, tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "model.safetensors")


def test_missing_shard_is_named(llama_dir, tmp_path):
    sharded = tmp_path / "sharded"
    transformers.AutoModelForCausalLM.from_pretrained(llama_dir).save_pretrained(sharded, max_shard_size="20KB")
    victim = sorted(sharded.glob("model-*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(CheckpointError) as error:
        load_model(sharded)
    assert_one_line(error.value, victim.name)


def test_truncated_file_is_named(llama_dir, tmp_path):
    folder = copy_checkpoint(llama_dir, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "model.safetensors", "truncated")
    weights.write_bytes(data[:5])
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "model.safetensors", "truncated")


def test_corrupt_header_is_named(llama_dir, tmp_path):
    folder = copy_checkpoint(llama_dir, tmp_path)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:20] = b"not json!!!!"
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "model.safetensors", "corrupt")


def test_missing_tensor_is_named(llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = copy_checkpoint(llama_dir, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "model.layers.1.mlp.up_proj.weight")


def test_weights_that_do_not_match_the_config(llama_dir, tmp_path):
    folder = copy_checkpoint(llama_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "shape", "config.json")


def test_unsupported_architecture_lists_supported_ones(llama_dir, tmp_path):
    folder = copy_checkpoint(llama_dir, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as error:
        load_model(folder)
    assert_one_line(error.value, "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


def test_unsupported_rope_scaling_is_named():
    raw = dict(architectures=["LlamaForCausalLM"], vocab_size=10, hidden_size=8, intermediate_size=16,
               num_hidden_layers=1, num_attention_heads=2, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(UnsupportedModelError) as error:
        ModelConfig.from_hf(raw)
    assert_one_line(error.value, "yarn", "llama3")


def test_config_reads_family_settings(checkpoint_factory):
    qwen3 = ModelConfig.from_dir(checkpoint_factory("qwen3"))
    assert qwen3.qk_norm and qwen3.head_dim == 32 and not qwen3.qkv_bias
    qwen2 = ModelConfig.from_dir(checkpoint_factory("qwen2"))
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.tie_word_embeddings
    mistral = ModelConfig.from_dir(checkpoint_factory("mistral"))
    assert mistral.sliding_window == 24 and mistral.head_dim == 24
    llama3 = ModelConfig.from_dir(checkpoint_factory("llama3"))
    assert llama3.rope_scaling["rope_type"] == "llama3" and llama3.num_kv_heads == 2


def test_bad_dtype_and_missing_gpu(llama_dir):
    with pytest.raises(CheckpointError) as error:
        load_model(llama_dir, dtype="float8")
    assert_one_line(error.value, "float8", "bfloat16")
    if not torch.cuda.is_available():
        with pytest.raises(CheckpointError) as error:
            load_model(llama_dir, device="cuda")
        assert_one_line(error.value, "cuda", "--device cpu")


def test_random_seed_changes_weights(tmp_path, tokenizer_dir):
    """Guard for the fixtures themselves: two seeds must give two different models."""
    a = load_model(build_checkpoint(tmp_path / "a", "llama2", tokenizer_dir, seed=1))
    b = load_model(build_checkpoint(tmp_path / "b", "llama2", tokenizer_dir, seed=2))
    assert not torch.equal(a.embed.weight, b.embed.weight)


def test_a_half_precision_checkpoint_keeps_its_precision_with_the_same_results(checkpoint_factory, tmp_path):
    from edge import Engine
    from edge.planning import plan_for

    source = checkpoint_factory("llama3")
    folders = {}
    for name, dtype in (("half", torch.float16), ("widened", torch.float32)):
        # the same float16 values, saved once as float16 and once widened to float32
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float16).to(dtype)
        folders[name] = tmp_path / name
        model.save_pretrained(folders[name])
        for item in source.glob("tokenizer*"):
            shutil.copy(item, folders[name] / item.name)
    half, widened = (Engine.load(folders[name], max_context=256, drafter="early-exit:1") for name in folders)
    assert half.model.layers[0].attn.wqkv.weight.dtype == torch.float16 and half.model.dtype == torch.float32
    assert widened.model.layers[0].attn.wqkv.weight.dtype == torch.float32
    assert half.model.weight_bytes() * 2 == widened.model.weight_bytes()
    prompt = "The quick brown fox jumps over the lazy dog."
    assert half.complete(prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0) == \
        widened.complete(prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0)
    tokens = torch.tensor([[3, 1, 4, 1, 5]])  # a verify-sized pass: the kernel widens the weights exactly
    logits = [engine.model.logits(engine.model(tokens, 0, engine.model.new_cache(8))) for engine in (half, widened)]
    assert torch.equal(*logits)
    plan = plan_for(folders["half"], budget=1 << 30, max_context=256)
    assert plan.footprint.target_weights == half.model.weight_bytes()

    from safetensors.torch import load_file, save_file

    mixed = tmp_path / "mixed"  # float16 matrices but a float32 norm: narrowing would lose that norm's bits
    shutil.copytree(folders["half"], mixed)
    tensors = load_file(mixed / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].float() + 1e-4
    save_file(tensors, str(mixed / "model.safetensors"), metadata={"format": "pt"})
    kept = load_model(mixed)
    assert kept.layers[0].attn.wqkv.weight.dtype == torch.float32
    assert torch.equal(kept.norm.weight, tensors["model.norm.weight"])


@pytest.mark.skipif(not __import__("os").path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_as_the_model_is_named_for_what_it_is(tmp_path):
    import os

    from edge import Engine

    with pytest.raises(CheckpointError) as error:
        Engine.load("/dev/zero")
    assert_one_line(error.value, "/dev/zero is a character device, not a model", "config.json")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(CheckpointError) as error:
        Engine.load(tmp_path / "pipe")
    assert_one_line(error.value, "is a named pipe, not a model")


@pytest.mark.skipif(not __import__("os").path.exists("/dev/zero"), reason="needs /dev/zero")
def test_weights_symlinked_to_a_device_are_refused_as_not_a_regular_file(llama_dir, tmp_path):
    folder = copy_checkpoint(llama_dir, tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError) as error:
        load_model(folder)
    assert_one_line(error.value, "model.safetensors is a symlink to /dev/zero, a character device, not a regular file")


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs named pipes")
def test_a_pipe_or_a_device_as_config_json_is_named_for_what_it_is(llama_dir, tmp_path):
    import os

    from edge import Engine

    folder = copy_checkpoint(llama_dir, tmp_path)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with pytest.raises(CheckpointError) as error:
        Engine.load(folder)
    assert_one_line(error.value, "config.json is a named pipe, not a config file")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError) as error:
        Engine.load(folder)
    assert_one_line(error.value, "config.json is a symlink to /dev/zero, a character device, not a config file")


def test_exporting_a_pipe_names_it(tmp_path):
    import os

    pytest.importorskip("onnx")
    from edge.errors import BundleError
    from edge.export.bundle import export_bundle

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(BundleError) as error:
        export_bundle(tmp_path / "pipe", tmp_path / "out.bundle", show_progress=False)
    assert_one_line(error.value, "pipe is a named pipe, not a model")


def test_a_bundle_whose_tokenizer_does_not_match_its_manifest_is_refused(llama_dir, tmp_path):
    from edge.backends.bundle import FORMAT, MANIFEST, read_bundle, sealed
    from edge.errors import BundleError
    from edge.text.tokenizer import Tokenizer

    folder = tmp_path / "bundle"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_dir / name, folder / name)
    vocab = Tokenizer.from_dir(folder).fingerprint()["vocab_sha256"]
    manifest = {"format": FORMAT, "format_version": 1, "files": {}, "tokenizer": {"sha256": vocab},
                "validation": {}}
    (folder / MANIFEST).write_text(json.dumps(sealed(manifest)))
    read_bundle(folder)  # matches
    (folder / MANIFEST).write_text(json.dumps(sealed({**manifest, "tokenizer": {"sha256": "0" * 64}})))
    with pytest.raises(BundleError) as error:
        read_bundle(folder)
    assert_one_line(error.value, "does not match the tokenizer.sha256 of its manifest", "re-export")
