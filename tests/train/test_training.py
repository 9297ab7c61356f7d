"""The training recipe: LayerSkip forward, data stream, schedule, and a resumable smoke run end to end."""

from __future__ import annotations


import pytest
import torch
import transformers

from train.data import TokenStream
from train.layerskip import LayerSkipConfig, exit_logits, heldout_losses, layer_outputs, layerskip_loss
from train.train import PRESETS, learning_rate


@pytest.fixture(scope="module")
def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_layer_outputs_reproduce_the_model_forward(tiny_llama):
    tokens = torch.randint(0, 64, (2, 12))
    *_, (last, hidden) = layer_outputs(tiny_llama, tokens)
    assert last == 3
    torch.testing.assert_close(exit_logits(tiny_llama, hidden), tiny_llama(tokens).logits, atol=1e-5, rtol=1e-5)


def test_layer_outputs_are_causal(tiny_llama):
    tokens = torch.randint(0, 64, (1, 10))
    changed = tokens.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 64
    *_, (_, a) = layer_outputs(tiny_llama, tokens)
    *_, (_, b) = layer_outputs(tiny_llama, changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_layerskip_loss_uses_rotating_exits_and_dropout(tiny_llama):
    recipe = LayerSkipConfig(max_dropout=0.5, rotation=2)
    assert [recipe.dropout(layer, 4) for layer in range(4)] == [0.0, 0.5 / 3, 1.0 / 3, 0.5]
    assert recipe.active_exits(0, 4) == [0, 2] and recipe.active_exits(1, 4) == [1]
    tokens = torch.randint(0, 64, (4, 8))
    loss, parts = layerskip_loss(tiny_llama, tokens[:, :-1], tokens[:, 1:], 0, recipe, torch.Generator().manual_seed(0))
    assert set(parts) == {"final_ce", "exit_0_ce", "exit_2_ce"}
    assert loss.requires_grad and torch.isfinite(loss)
    losses = heldout_losses(tiny_llama, [(tokens[:, :-1], tokens[:, 1:])])
    assert len(losses) == 4 and all(value > 0 for value in losses)


def test_token_stream_is_seeded_and_resumable():
    examples = [[i] * (i % 3 + 1) for i in range(40)]
    a, b = TokenStream(examples, 4, 2, seed=3), TokenStream(examples, 4, 2, seed=3)
    for _ in range(10):
        x, y = a.next_batch()
        assert torch.equal(x, b.next_batch()[0]) and torch.equal(x[:, 1:], y[:, :-1])
    saved = a.state()
    expected = [a.next_batch()[0] for _ in range(5)]
    c = TokenStream(examples, 4, 2, seed=3)
    c.restore(saved)
    assert all(torch.equal(x, c.next_batch()[0]) for x in expected)
    assert a.epoch >= 1  # 80 tokens, 8 per batch: the stream wrapped into a new shuffled epoch


def test_learning_rate_warms_up_then_decays():
    preset = PRESETS["target"]
    rates = [learning_rate(step, preset) for step in range(preset.steps)]
    peak = rates.index(max(rates))
    assert peak == preset.warmup - 1 and max(rates) == pytest.approx(preset.lr)
    assert all(x >= y for x, y in zip(rates[peak:], rates[peak + 1 :]))
    assert rates[-1] == pytest.approx(0.1 * preset.lr, rel=0.01)


def test_token_stream_draws_examples_by_their_mixture_weight():
    examples = [[1], [2, 2], [3, 3, 3]]
    stream = TokenStream(examples, 2, 1, seed=0, weights=[0.0, 3.0, 0.5])
    assert stream.total_tokens == round(2 * 3 + 3 * 0.5)
    counts = [0, 0, 0]
    for epoch in range(40):
        tokens = stream._epoch_tokens(epoch).tolist()
        assert 1 not in tokens and tokens.count(2) == 6  # weight 0: never; weight 3: three times every epoch
        counts[2] += tokens.count(3) // 3
    assert 10 <= counts[2] <= 30  # weight 0.5: in about half of the epochs
    with pytest.raises(ValueError, match="one non-negative weight per example"):
        TokenStream(examples, 2, 1, weights=[1.0, -1.0, 1.0])


def test_a_deeper_feature_drafter_starts_out_drafting_as_the_one_it_grows_from(tiny_llama, tmp_path):
    import copy

    from train.feature_drafter import FeatureDrafter, drafter_losses

    target = copy.deepcopy(tiny_llama).requires_grad_(False)
    shallow = FeatureDrafter(target.config)
    shallow.init_from_target(target)
    torch.nn.init.normal_(shallow.fc.weight, std=0.1)  # a drafter that is no longer its starting point
    shallow.save(tmp_path / "shallow")
    deeper = FeatureDrafter(target.config, layers=2)
    deeper.init_from_target(target)
    deeper.load_trained(tmp_path / "shallow")
    features, embeds = torch.randn(2, 9, 32), torch.randn(2, 9, 32)
    torch.testing.assert_close(deeper(features, embeds), shallow(features, embeds))
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    loss, _ = drafter_losses(deeper, target, tokens)
    loss.backward()
    assert deeper.body.layers[1].mlp.down_proj.weight.grad.abs().sum() > 0  # the added layer learns from the start
    with pytest.raises(SystemExit, match="more than --layers 1; pass --layers 2 or more"):
        deeper.save(tmp_path / "deeper")
        FeatureDrafter(target.config).load_trained(tmp_path / "deeper")


def test_the_feature_drafter_trains_on_the_frozen_targets_features(tiny_llama):
    import copy

    from train.feature_drafter import FeatureDrafter, drafter_losses

    target = copy.deepcopy(tiny_llama).requires_grad_(False)
    drafter = FeatureDrafter(target.config)
    drafter.init_from_target(target)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    loss, parts = drafter_losses(drafter, target, tokens)
    loss.backward()
    assert torch.isfinite(loss) and {"kl1", "kl2", "reg1", "reg2", "agree1", "agree2"} <= set(parts)
    assert drafter.fc.weight.grad is not None and drafter.body.layers[0].mlp.up_proj.weight.grad is not None
    assert drafter.body.embed_tokens.weight.grad is None  # the target's embedding, kept frozen
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(15):
        optimizer.zero_grad()
        later, _ = drafter_losses(drafter, target, tokens)
        later.backward()
        optimizer.step()
    assert later.item() < loss.item()


def test_a_drafter_trained_on_a_trimmed_vocabulary_sees_only_those_rows_of_the_head(tiny_llama):
    """With kept ids the losses use those head rows alone: the same as the full head's distributions renormalized
    over the kept tokens."""
    import copy

    from train.feature_drafter import FeatureDrafter, drafter_losses

    target = copy.deepcopy(tiny_llama).requires_grad_(False)
    drafter = FeatureDrafter(target.config)
    drafter.init_from_target(target)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    everything = torch.arange(target.config.vocab_size)
    full, full_parts = drafter_losses(drafter, target, tokens)
    same, same_parts = drafter_losses(drafter, target, tokens, everything)
    assert torch.allclose(full, same) and full_parts == same_parts  # keeping every row changes nothing
    kept = torch.arange(0, target.config.vocab_size, 3)
    trimmed, parts = drafter_losses(drafter, target, tokens, kept)
    trimmed.backward()
    assert torch.isfinite(trimmed) and not torch.allclose(trimmed, full)
    assert drafter.fc.weight.grad is not None


def test_a_gguf_target_becomes_a_float_checkpoint_with_its_own_tokenizer_for_training(llama_dir, tmp_path):
    """A drafter for a real model trains against the file's exact values in transformers, on data encoded with the
    model's own tokenizer and chat template."""
    from tests.gguf_files import write_gguf
    from transformers import AutoModelForCausalLM

    from edge import Engine
    from edge.text.tokenizer import Tokenizer
    from train.float_checkpoint import write_float_checkpoint
    from train.tokenizer import TargetTokenizer, encode_example

    gguf = write_gguf(llama_dir, tmp_path / "tiny.Q8_0.gguf", "q8_0")
    folder = write_float_checkpoint(gguf, tmp_path / "float")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = Engine.load(gguf, weights="float16", dtype="float32", max_context=64).model  # the file, dequantized
    tokens = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        expected = reference.forward_logits(tokens, 0, reference.new_cache(16))[0]  # (T, V)
        got = model(tokens).logits[0]  # (T, V)
    assert (got - expected).norm() / expected.norm() < 2e-3  # the reference rounds the values to 16 bits
    chat = {"kind": "reply", "messages": [{"role": "user", "content": "Hi there"},
                                          {"role": "assistant", "content": "Hello!"}]}
    own = Tokenizer.from_dir(folder).encode_chat(chat["messages"], add_generation_prompt=False)
    assert encode_example(chat, TargetTokenizer(folder)) == own
