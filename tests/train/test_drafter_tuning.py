"""The drafters' second stage: the target's own greedy replies (train.replies), then tuning both drafters on them."""

from __future__ import annotations

import json

import pytest
import torch

from train import feature_drafter, replies
from train.model_card import feature_card_text, read_log
from train.train import Preset

WORDS = "open read write path file module class function value list dict string bytes socket thread".split()


def write_corpus(folder, examples: int = 24) -> None:
    """A tiny corpus in train.corpus's format: chat turns and one code chunk per split."""
    folder.mkdir()
    for split, count in (("train", examples), ("heldout", 6)):
        rows = [{"kind": "code", "text": "def f(x):\n    return x + 1\n"}]
        for index in range(count):
            topic = " ".join(WORDS[(index + step) % len(WORDS)] for step in range(4))
            rows.append({"kind": "chat_module", "messages": [
                {"role": "user", "content": f"What does {topic} do? ({split} {index})"},
                {"role": "assistant", "content": f"It handles the {topic} of a program, one at a time."}]})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_user_turns_are_the_last_user_messages_in_a_seeded_order(tmp_path):
    write_corpus(tmp_path / "corpus")
    turns = replies.user_turns(tmp_path / "corpus", 10, seed=7)
    assert len(turns) == 10 and all(turn["role"] == "user" for turn in turns)
    assert turns == replies.user_turns(tmp_path / "corpus", 10, seed=7)
    assert turns != replies.user_turns(tmp_path / "corpus", 10, seed=8)
    assert len(replies.user_turns(tmp_path / "corpus", 1000)) == 24  # only chat examples; the code chunk has no turn


@pytest.fixture(scope="module")
def tuning_inputs(tmp_path_factory, llama_dir):
    """A corpus, and the tiny target's greedy replies to 6 of its turns, written by `python -m train.replies`."""
    root = tmp_path_factory.mktemp("tuning")
    write_corpus(root / "corpus")
    out = root / "replies.jsonl"
    assert replies.main(["--target", str(llama_dir), "--corpus", str(root / "corpus"), "--out", str(out),
                         "--count", "6", "--max-new-tokens", "6", "--threads", "1"]) == 0
    return root, out


def test_replies_are_the_targets_greedy_answers_in_the_corpus_format(tuning_inputs, llama_dir):
    from edge.engine import Engine

    root, out = tuning_inputs
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and not out.with_name(out.name + ".tmp").exists()
    assert [row["messages"][0] for row in rows] == replies.user_turns(root / "corpus", 6)
    engine = Engine.load(llama_dir, max_context=512)
    expected = "".join(event.text for event in engine.chat([rows[2]["messages"][0]], max_new_tokens=6, temperature=0.0))
    assert rows[2] == {"kind": "reply", "messages": [rows[2]["messages"][0],
                                                     {"role": "assistant", "content": expected}]}


def test_an_interrupted_replies_run_goes_on_where_it_stopped(tuning_inputs, llama_dir, tmp_path, monkeypatch):
    root, complete = tuning_inputs
    lines = complete.read_text().splitlines(keepends=True)
    out = tmp_path / "replies.jsonl"
    out.with_name(out.name + ".tmp").write_text("".join(lines[:2]) + lines[2][:10])  # cut short inside a line
    answered = []
    real = replies.greedy_replies

    def counting(target, conversations, max_new_tokens, drafter=None):
        answered.extend(conversations)
        return real(target, conversations, max_new_tokens, drafter)

    monkeypatch.setattr(replies, "greedy_replies", counting)
    assert replies.main(["--target", str(llama_dir), "--corpus", str(root / "corpus"), "--out", str(out),
                         "--count", "6", "--max-new-tokens", "6", "--threads", "1"]) == 0
    assert len(answered) == 4  # the two complete replies were kept, the cut one answered again
    assert out.read_text() == complete.read_text()

    answered.clear()  # the pipeline run again (after its training step was interrupted): the replies are kept
    assert replies.main(["--target", str(llama_dir), "--corpus", str(root / "corpus"), "--out", str(out),
                         "--count", "6", "--max-new-tokens", "6", "--threads", "1"]) == 0
    assert answered == [] and out.read_text() == complete.read_text()


def test_replies_drafted_by_a_draft_model_are_the_plain_replies(tuning_inputs, llama_dir, tmp_path, monkeypatch):
    from edge.engine import Engine

    root, complete = tuning_inputs
    out, drafters = tmp_path / "replies.jsonl", []
    load = Engine.load.__func__

    def recording(cls, path, **options):
        engine = load(cls, path, **options)
        drafters.append(engine.drafter.name if engine.drafter else None)
        return engine

    monkeypatch.setattr(Engine, "load", classmethod(recording))
    assert replies.main(["--target", str(llama_dir), "--corpus", str(root / "corpus"), "--out", str(out),
                         "--count", "6", "--max-new-tokens", "6", "--threads", "1",
                         "--drafter", f"draft:{llama_dir}"]) == 0
    assert drafters == ["draft-model"] and out.read_text() == complete.read_text()


def tiny_drafter(target_dir, folder):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    drafter = feature_drafter.FeatureDrafter(target.config)
    drafter.init_from_target(target)
    drafter.save(folder)
    return target, drafter


def test_a_saved_drafter_loads_back_unchanged(tmp_path, llama_dir):
    target, saved = tiny_drafter(llama_dir, tmp_path / "saved")
    loaded = feature_drafter.FeatureDrafter(target.config)
    loaded.init_from_target(target)
    with torch.no_grad():
        loaded.fc.weight.add_(1.0)  # differs until the saved weights are loaded
    loaded.load_trained(tmp_path / "saved")
    for (name, a), (_, b) in zip(saved.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert not loaded.body.embed_tokens.weight.requires_grad


def test_tuning_starts_from_the_trained_drafter_and_evaluates_on_held_back_replies(tmp_path, tuning_inputs,
                                                                                     llama_dir, tokenizer_dir,
                                                                                     monkeypatch):
    root, reply_file = tuning_inputs
    _, initial = tiny_drafter(llama_dir, tmp_path / "stage1")
    monkeypatch.setattr(feature_drafter, "REPLIES_HELD_BACK", 2)
    monkeypatch.setattr(feature_drafter, "TUNE_PRESET", Preset(
        hidden_size=0, intermediate_size=0, num_layers=1, num_heads=0, num_kv_heads=0, steps=3, batch_size=2,
        seq_len=16, lr=1e-2, warmup=1, mix=feature_drafter.TUNE_PRESET.mix))
    out = tmp_path / "tuned"
    assert feature_drafter.main(["--target", str(llama_dir), "--corpus", str(root / "corpus"), "--tokenizer",
                                 str(tokenizer_dir), "--init", str(tmp_path / "stage1"), "--replies",
                                 str(reply_file), "--out", str(out), "--eval-every", "3", "--heldout-batches", "1",
                                 "--threads", "1"]) == 0
    log = read_log(out / "log.jsonl")
    start = log[0]
    assert start["replies_trained"] == 4 and start["replies_held_back"] == 2 and start["corpus_share"] == 0.3
    assert start["mix"]["reply"] == 1.0 and start["mix"]["chat_module"] == pytest.approx(0.3 * 8.0)
    evals = [record for record in log if record["event"] == "eval"]
    assert [record["step"] for record in evals] == [0, 3]  # before tuning, and after
    assert all(len(record["replies_agreement"]) == 2 and len(record["heldout_agreement"]) == 2 for record in evals)

    tuned = feature_drafter.FeatureDrafter(initial.config)
    tuned.load_trained(out / "final")
    assert not torch.equal(tuned.fc.weight, initial.fc.weight)  # trained from the stage-1 weights on
    card = feature_card_text(log, out / "final", tuning=log)
    assert "Tuned on the target's own replies" in card and "6 user turns" in card
    assert "This folder holds the tuned model" in card
    staged = feature_card_text(log, out / "final", tuning=log, task_tuning=log)  # a second stage after the first
    assert "This folder holds the tuned model" not in staged and "This folder holds this model" in staged
    assert "requests people make" in staged and staged.index("own replies") < staged.index("requests people make")


def test_tuning_needs_both_a_drafter_and_replies(tmp_path, llama_dir):
    with pytest.raises(SystemExit):
        feature_drafter.main(["--target", str(llama_dir), "--init", str(tmp_path), "--out", str(tmp_path / "x")])


def test_the_draft_model_tunes_on_replies_from_its_trained_weights(tmp_path, tuning_inputs, llama_dir,
                                                                   tokenizer_dir, monkeypatch):
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from train import train

    root, reply_file = tuning_inputs
    tiny = Preset(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, steps=3,
                  batch_size=2, seq_len=16, warmup=1, lr=1e-2, distill=True, tunes=True, precision="float32",
                  mix=train.REPLY_MIX)
    monkeypatch.setitem(train.PRESETS, "drafter-replies", tiny)
    monkeypatch.setattr(train, "REPLIES_HELD_BACK", 2)
    torch.manual_seed(0)
    train.build_model(tiny, Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")), tokenizer_dir).save_pretrained(
        tmp_path / "stage1")
    out = tmp_path / "tuned"
    common = ["--preset", "drafter-replies", "--corpus", str(root / "corpus"), "--tokenizer", str(tokenizer_dir),
              "--teacher", str(llama_dir), "--out", str(out), "--threads", "1"]
    with pytest.raises(SystemExit):  # a tuning preset needs both a start and the replies
        train.main([*common, "--init", str(tmp_path / "stage1")])
    assert train.main([*common, "--init", str(tmp_path / "stage1"), "--replies", str(reply_file),
                       "--eval-every", "3", "--heldout-batches", "1"]) == 0
    log = read_log(out / "log.jsonl")
    assert log[0]["replies_trained"] == 4 and log[0]["init"] == str(tmp_path / "stage1")
    evals = [record for record in log if record["event"] == "eval"]
    assert [record["step"] for record in evals] == [0, 3] and all("replies_ppl" in record for record in evals)
    before, after = load_file(str(tmp_path / "stage1" / "model.safetensors")), load_file(
        str(out / "final" / "model.safetensors"))
    assert before.keys() == after.keys()
    assert not torch.equal(before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"])
    with pytest.raises(SystemExit, match="not a checkpoint"):
        train.main([*common, "--init", str(llama_dir), "--replies", str(reply_file), "--out", str(tmp_path / "x")])
