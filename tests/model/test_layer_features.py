"""The residual streams after chosen layers (edge/model/layer_features.py, EAGLE-3's target features): the torch path
keeps exactly its layers' outputs, the fused C calls (a prefill through the fused layers, decode steps and verify
passes through the one-call step, a token tree moved into place by keep_rows) keep exactly what their own layers
compute, and plain passes are unchanged by keeping them."""

from __future__ import annotations

import pytest
import torch

from edge.model.kernel_glue import ModelTensors, use_kernel, verifies_trees
from edge.model.layer_features import default_layers, keep_layer_features, layer_features
from edge.model.transformer import keep_rows
from edge.sources.loading import load_model

LAYERS = (1, 0, 2, 1)  # any order, a layer twice


@pytest.fixture(scope="module")
def tokens(llama_dir):
    vocab = load_model(llama_dir).config.vocab_size
    return torch.randint(0, vocab, (14,), generator=torch.Generator().manual_seed(4)).tolist()


def torch_layer_outputs(model, tokens: list[int]) -> list[torch.Tensor]:
    """Each layer's output (T, D), running the torch blocks one by one."""
    cache = model.new_cache(len(tokens))
    with torch.inference_mode():
        x = model.embed(torch.tensor([tokens])).to(model.dtype)  # (1, T, D)
        rope = model.rope(0, len(tokens), x.dtype)
        outputs = []
        for layer in range(model.config.num_layers):
            x = model.layers[layer](x, layer, 0, cache, rope, None)
            outputs.append(x[0].clone())
    return outputs


def fused_layer_outputs(model, tokens: list[int]) -> list[torch.Tensor]:
    """Each layer's output (T, D), running the fused C layers 0 .. j for every j."""
    outputs = []
    for layer in range(model.config.num_layers):
        cache = model.new_cache(len(tokens))
        with torch.inference_mode():
            x = model.embed(torch.tensor([tokens])).float()[0]  # (T, D)
            rope = model.rope(0, len(tokens), x.dtype, local=None)
            assert model.runner.fuses(ModelTensors(model), len(tokens), x.dtype, cache)
            outputs.append(model.runner.layers(x, range(layer + 1), 0, cache, rope).clone())
    return outputs


def test_the_torch_path_keeps_its_layers_outputs(llama_dir, tokens):
    model = load_model(llama_dir)
    use_kernel(model, None)
    outputs = torch_layer_outputs(model, tokens)
    assert torch.equal(layer_features(model, tokens, LAYERS), torch.cat([outputs[j] for j in LAYERS], -1))


def test_the_fused_calls_keep_what_their_layers_compute(llama_dir, tokens):
    model = load_model(llama_dir)
    assert model.runner.matmul is not None, "the CPU kernel builds here"
    expected = torch.cat([fused_layer_outputs(model, tokens)[j] for j in LAYERS], -1)  # (T, 4D)
    assert torch.equal(layer_features(model, tokens, LAYERS), expected)  # a prefill through the fused layers
    kept = keep_layer_features(model, LAYERS, 32)
    cache = model.new_cache(32)
    with torch.inference_mode():  # a verify pass, then decode steps, through the one-call step
        model.forward_logits(torch.tensor([tokens[:9]]), 0, cache)
        for position in range(9, len(tokens)):
            model.forward_logits(torch.tensor([[tokens[position]]]), position, cache)
    assert torch.equal(kept.rows[:len(tokens)], expected)
    torch_model = load_model(llama_dir)
    use_kernel(torch_model, None)
    assert torch.allclose(layer_features(torch_model, tokens, LAYERS), expected, atol=1e-4)


def test_a_token_tree_keeps_the_accepted_paths_features(llama_dir, tokens):
    model = load_model(llama_dir)
    kept = keep_layer_features(model, LAYERS, 32)
    cache = model.new_cache(32)
    r, a, b, x, y = tokens[9:14]
    with torch.inference_mode():
        model.forward_logits(torch.tensor([tokens[:9]]), 0, cache)
        assert verifies_trees(model, cache, 5)
        model.forward_logits(torch.tensor([[r, a, b, x, y]]), 9, cache, parents=[-1, 0, 1, 0, 3])
    keep_rows(model, 9, [0, 3, 4], cache)  # accept r x y
    path = tokens[:9] + [r, x, y]
    assert torch.equal(kept.rows[:12], layer_features(model, path, LAYERS))


def test_keeping_features_leaves_the_logits_alone(llama_dir, tokens):
    model = load_model(llama_dir)
    plain_cache, kept_cache = model.new_cache(32), model.new_cache(32)
    with torch.inference_mode():
        plain = model.forward_logits(torch.tensor([tokens]), 0, plain_cache)
        keep_layer_features(model, LAYERS, 32)
        kept = model.forward_logits(torch.tensor([tokens]), 0, kept_cache)
    assert torch.equal(plain, kept)


def test_layer_ids_are_checked_and_default_to_eagle3s(llama_dir):
    model = load_model(llama_dir)
    with pytest.raises(ValueError, match="within the model's 3 layers"):
        keep_layer_features(model, (0, 3), 8)
    assert default_layers(32) == (1, 15, 28)  # the streams entering layers 2, 16 and 29
    assert default_layers(3) == (1, 0, 0)
