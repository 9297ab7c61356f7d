"""train.eagle3 end to end on a small target: features from its prefill passes, a few steps, a head in the hub's
layout that `eagle3:PATH` loads and that keeps greedy output the target's own; a run started again resumes."""

from __future__ import annotations

import json

import torch

from edge import Engine
from train import eagle3
from tests.helpers import greedy


def write_replies(path, count: int) -> None:
    words = ["the", "json", "module", "reads", "and", "writes", "text", "files", "of", "data"]
    lines = []
    for i in range(count):
        reply = " ".join(words[(i + j) % len(words)] for j in range(12))
        lines.append(json.dumps({"kind": "reply", "messages": [{"role": "user", "content": f"question {i}?"},
                                                               {"role": "assistant", "content": reply}]}))
    path.write_text("\n".join(lines) + "\n")


def test_a_trained_head_loads_as_an_eagle3_drafter_and_keeps_greedy_output(llama_dir, tmp_path):
    replies, out = tmp_path / "replies.jsonl", tmp_path / "run"
    write_replies(replies, 10)
    common = ["--target", str(llama_dir), "--replies", str(replies), "--out", str(out), "--batch", "2",
              "--seq-len", "24", "--held-out", "2", "--draft-vocab", "64", "--intermediate", "32", "--save-every", "2"]
    assert eagle3.main([*common, "--steps", "2"]) == 0
    assert torch.load(out / "checkpoint.pt")["step"] == 2
    assert eagle3.main([*common, "--steps", "4"]) == 0  # resumes from step 2, features cached
    card = json.loads((out / "final" / "card.json").read_text())
    assert card["steps"] == 4 and len(card["held_out_top1_by_draft_position"]) == 3
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] <= 64
    engine = Engine.load(llama_dir)
    plain = greedy(engine, max_new_tokens=16)
    engine.use_drafter(f"eagle3:{out / 'final'}", 3)
    assert greedy(engine, max_new_tokens=16) == plain


def test_the_trained_head_computes_what_the_runtime_head_computes(tmp_path):
    """The trainer's head and edge's run-time head (eagle3_head.Eagle3Layer) read the same saved tensors and give
    the same logits for the same features and embeddings: what training fits is what drafting runs."""
    from types import SimpleNamespace

    from edge.decoding.drafters.eagle3_head import Eagle3Config, Eagle3Layer, read_tensors

    torch.manual_seed(0)
    head = eagle3.Eagle3Head(hidden=32, intermediate=48, heads=4, kv_heads=2, head_dim=8, draft_vocab=20, layers=3,
                             eps=1e-6, rope_theta=10000.0)
    for parameter in head.parameters():
        parameter.data.normal_(0, 0.3)
    kept = torch.arange(0, 40, 2)  # (20,) target ids
    eagle3.save_head(tmp_path, head, kept, (0, 1, 2), SimpleNamespace(hidden_size=32, vocab_size=50), {})
    saved = read_tensors(tmp_path)
    assert (kept == torch.arange(20) + saved["d2t"]).all() and int(saved["t2d"].sum()) == 20
    head.load_state_dict({name: value.float() for name, value in saved.items() if name not in ("d2t", "t2d")})
    runtime = Eagle3Layer(Eagle3Config.read(tmp_path), saved, max_len=16, dtype=torch.float32,
                          device=torch.device("cpu"))
    features, embeds = torch.randn(1, 10, 96), torch.randn(1, 10, 32)  # (1, T, 3D), (1, T, D)
    with torch.no_grad():
        trained = head.logits(head.layer(head.fc(features), embeds))[0]  # (T, Vd)
    ran = runtime.logits(runtime.forward(runtime.fuse(features[0]), embeds[0], 0))  # (T, Vd)
    torch.testing.assert_close(ran, trained, rtol=1e-4, atol=1e-4)


def write_corpus(folder, count: int) -> None:
    folder.mkdir()
    lines = [json.dumps({"kind": "chat", "messages": [{"role": "user", "content": f"What does function {i} do?"},
                                                      {"role": "assistant", "content": f"It reads file {i} and "
                                                       "writes the json data it holds."}]}) for i in range(count)]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")


def test_corpus_answers_are_labelled_with_the_targets_own_greedy_choices(llama_dir, tmp_path):
    write_corpus(tmp_path / "corpus", 3)
    engine, layers = eagle3.target_and_layers(str(llama_dir))
    conversations = eagle3.corpus_conversations(tmp_path / "corpus", 3)
    files = eagle3.extract_features(engine, layers, conversations, tmp_path / "features", distilled=True)
    for path in files:
        record = torch.load(path)
        ids, mask, following = record["ids"], record["mask"], record["next"]
        with torch.inference_mode():
            logits = engine.model.forward_logits(ids[None], 0, engine.model.new_cache(ids.numel()))[0]  # (T, V)
        rows = mask.nonzero()[:, 0] - 1  # the rows whose next token is an answer token
        assert (following[rows] == logits[rows].argmax(-1)).all()
        outside = torch.ones_like(mask)
        outside[rows] = False
        assert (following[outside] == -1).all()


def test_a_head_started_from_the_target_scores_as_the_targets_head_over_the_draft_vocabulary(llama_dir):
    engine, _ = eagle3.target_and_layers(str(llama_dir))
    config, kept = engine.model.config, torch.tensor([3, 5, 8, 13, 21])
    head = eagle3.Eagle3Head(config.hidden_size, 32, config.num_heads, config.num_kv_heads, config.head_dim,
                             kept.numel(), 3, config.rms_norm_eps, config.rope_theta)
    eagle3.start_from_target(head, engine.model, kept, train_head=False)
    out = torch.randn(1, 4, config.hidden_size)  # (1, T, D): a layer output
    with torch.no_grad():
        target = engine.model.logits(engine.model.norm(out))[..., kept]  # (1, T, 5)
        torch.testing.assert_close(head.logits(out), target.float(), rtol=1e-4, atol=1e-4)
    assert not head.lm_head.weight.requires_grad and head.norm.weight.requires_grad


def test_training_on_corpus_conversations_alone(llama_dir, tmp_path):
    write_corpus(tmp_path / "corpus", 6)
    out = tmp_path / "run"
    assert eagle3.main(["--target", str(llama_dir), "--corpus", str(tmp_path / "corpus"), "--corpus-count", "6",
                        "--out", str(out), "--batch", "2", "--seq-len", "24", "--held-out", "2", "--draft-vocab", "64",
                        "--intermediate", "32", "--steps", "2"]) == 0
    card = json.loads((out / "final" / "card.json").read_text())
    assert card["corpus_conversations"] == 6 and card["training_examples"] == 4 and card["head_from_target"]


def test_features_keep_the_targets_likeliest_next_tokens_as_soft_labels(llama_dir, tmp_path):
    write_corpus(tmp_path / "corpus", 2)
    engine, layers = eagle3.target_and_layers(str(llama_dir))
    conversations = eagle3.corpus_conversations(tmp_path / "corpus", 2)
    for path in eagle3.extract_features(engine, layers, conversations, tmp_path / "features", distilled=True):
        record = torch.load(path)
        rows = record["mask"].nonzero()[:, 0] - 1
        ids, logprobs = record["soft_ids"], record["soft_logprobs"].float()  # (T, K) each
        assert ids.shape[1] == eagle3.SOFT_TOP and (ids[rows, 0] == record["next"][rows]).all()
        assert (logprobs[rows] <= 0).all() and (logprobs[rows].diff(dim=-1) <= 0).all()  # likeliest first
        outside = torch.ones_like(record["mask"])
        outside[rows] = False
        assert (ids[outside] == -1).all()


def test_soft_targets_keep_only_the_draft_vocabulary_and_sum_to_one():
    t2d = torch.tensor([-1, 0, 1, -1, 2])  # target ids 1, 2, 4 are draft ids 0, 1, 2
    soft_ids = torch.tensor([[3, 1, 2, 0], [4, 2, -1, -1]])  # (2, K)
    soft_logprobs = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.6, 0.4, 0.0, 0.0]]).log()
    draft, probs = eagle3.soft_targets(soft_ids, soft_logprobs, t2d)
    torch.testing.assert_close(probs, torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.6, 0.4, 0.0, 0.0]]))
    assert draft[0, 1:3].tolist() == [0, 1] and draft[1, :2].tolist() == [2, 1]


def test_a_certain_target_gives_the_soft_loss_the_greedy_loss():
    """Where the target puts all its probability on its choice, fitting its distribution is fitting its choice."""
    torch.manual_seed(0)
    D, Vd, T = 16, 12, 9
    head = eagle3.Eagle3Head(hidden=D, intermediate=24, heads=2, kv_heads=1, head_dim=8, draft_vocab=Vd, layers=3,
                             eps=1e-6, rope_theta=10000.0)
    embed, t2d = torch.nn.Embedding(30, D), torch.arange(30).where(torch.arange(30) < Vd, -1)
    ids, following = torch.randint(0, 30, (1, T)), torch.randint(0, Vd, (1, T))
    mask = torch.ones(1, T, dtype=torch.bool)
    soft_ids = torch.cat((following[..., None], torch.randint(0, 30, (1, T, 3))), -1)  # (1, T, 4): the choice first
    soft_logprobs = torch.tensor([0.0, -60.0, -60.0, -60.0]).expand(1, T, 4)
    features = torch.randn(1, T, 3 * D)
    args = (head, embed, t2d, ids, mask, following, soft_ids, soft_logprobs, features, 1)
    soft, agreement = eagle3.losses(*args, soft=True)
    greedy, same = eagle3.losses(*args, soft=False)
    torch.testing.assert_close(soft, greedy)
    assert agreement == same


def test_features_cached_without_soft_labels_still_train(llama_dir, tmp_path):
    replies, out = tmp_path / "replies.jsonl", tmp_path / "run"
    write_replies(replies, 6)
    common = ["--target", str(llama_dir), "--replies", str(replies), "--out", str(out), "--batch", "2",
              "--seq-len", "24", "--held-out", "2", "--draft-vocab", "64", "--intermediate", "32"]
    assert eagle3.main([*common, "--steps", "1"]) == 0
    for path in (out / "features").glob("*.pt"):  # as a cache written before soft labels were kept
        record = torch.load(path)
        del record["soft_ids"], record["soft_logprobs"]
        torch.save(record, path)
    (out / "checkpoint.pt").unlink()
    assert eagle3.main([*common, "--steps", "2"]) == 0
    assert json.loads((out / "final" / "card.json").read_text())["labels"] == "soft"
