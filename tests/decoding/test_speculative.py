"""The core invariant: speculative decoding emits exactly what the target alone would, for every drafter."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from tests.conftest import build_checkpoint
from edge import EdgeError, Engine, SamplingError, TokenizerError
from edge.events import FINISH_MAX_TOKENS
from edge.model.kv_cache import KVCache

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "import os\nfor name in os.listdir('.'):\n    print(name",
    "Speculative decoding drafts several tokens",
]
DRAFTERS = ["ngram", "ngram:2", "early-exit:1", "early-exit:2", "skip:1", "adaptive", "self", "small",
            "hybrid:small", "hybrid:early-exit:1", "feature", "hybrid:feature"]


@pytest.fixture(scope="module")
def checkpoints(checkpoint_factory, tmp_path_factory, tokenizer_dir):
    target = checkpoint_factory("llama3")
    small = build_checkpoint(tmp_path_factory.mktemp("small-drafter"), "llama3", tokenizer_dir, seed=5,
                             num_hidden_layers=1, vocab_size=336)  # vocabulary padded by 16 rows
    return {"target": target, "small": small,
            "feature": build_feature_drafter(target, tmp_path_factory.mktemp("feature-drafter"))}


def build_feature_drafter(target_dir, folder, seed: int = 3):
    """A feature drafter for the target: initialised from its last layer, then perturbed (some drafts fail)."""
    from transformers import AutoModelForCausalLM

    from train.feature_drafter import FeatureDrafter

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    drafter = FeatureDrafter(target.config)
    drafter.init_from_target(target)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in drafter.named_parameters():
            if weight.requires_grad and weight.dim() == 2:
                weight.add_(torch.randn(weight.shape, generator=generator) * 0.02)
    drafter.save(folder)
    return folder


def drafter_spec(name: str, checkpoints) -> str:
    if name == "self":  # the target drafting for itself: every draft is accepted
        return f"draft:{checkpoints['target']}"
    if name == "small":
        return f"draft:{checkpoints['small']}"
    if name == "feature":
        return f"feature:{checkpoints['feature']}"
    if name.startswith("hybrid:"):
        return "hybrid:" + drafter_spec(name.removeprefix("hybrid:"), checkpoints)
    return name


def ids_of(events) -> list[int]:
    return [token for event in events for token in event.token_ids]


@pytest.fixture(scope="module")
def reference(checkpoints):
    engine = Engine.load(checkpoints["target"], max_context=512)
    return {prompt: ids_of(engine.generate(prompt, max_new_tokens=160, ignore_eos=True, temperature=0.0)) for prompt in PROMPTS}


@pytest.mark.slow
@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("length", ["adaptive", "adaptive:0.05", 1, 3, 6])
def test_greedy_speculative_equals_autoregressive(checkpoints, reference, name, length):
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec(name, checkpoints),
                         draft_length=length)
    for prompt in PROMPTS:
        events = list(engine.generate(prompt, max_new_tokens=160, ignore_eos=True, temperature=0.0))
        assert ids_of(events) == reference[prompt], (name, length, prompt)
        assert events[-1].finish_reason == FINISH_MAX_TOKENS


def test_greedy_equivalence_holds_across_chat_turns_and_stops(checkpoints):
    plain = Engine.load(checkpoints["target"], max_context=512)
    fast = Engine.load(checkpoints["target"], max_context=512, drafter="early-exit:2")
    messages = [{"role": "user", "content": "Hello there"}]
    for turn in range(3):
        a = list(plain.chat(messages, max_new_tokens=40, stop=["xyz"], temperature=0.0))
        b = list(fast.chat(messages, max_new_tokens=40, stop=["xyz"], temperature=0.0))
        assert ids_of(a) == ids_of(b) and "".join(e.text for e in a) == "".join(e.text for e in b)
        assert a[-1].finish_reason == b[-1].finish_reason
        messages += [{"role": "assistant", "content": "".join(e.text for e in a)}, {"role": "user", "content": "More"}]


def test_perfect_drafter_stats_and_provenance(checkpoints):
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec("self", checkpoints),
                         draft_length=4)
    events = list(engine.generate(PROMPTS[0], max_new_tokens=41, ignore_eos=True, temperature=0.0))
    stats = events[-1].stats
    # the prefill emits the first token; each later step drafts 4, accepts 4 and adds the target's bonus token
    assert stats.generated_tokens == 41 and stats.steps == 1 + 8
    assert stats.drafted == 32 and stats.accepted == 32 and stats.acceptance_rate == 1.0
    assert stats.accepted_by_position == [8, 8, 8, 8]
    assert stats.mean_accepted_tokens == pytest.approx(41 / 9)
    step_events = events[1:]
    assert all(e.drafted == (True, True, True, True, False) for e in step_events)
    assert stats.draft_s > 0 and stats.verify_s > 0


def test_plain_decoding_reports_one_token_per_step(checkpoints):
    engine = Engine.load(checkpoints["target"], max_context=512, drafter="ngram")
    stats = list(engine.generate(PROMPTS[0], max_new_tokens=20, ignore_eos=True, speculate=False, temperature=0.0))[-1].stats
    assert stats.mean_accepted_tokens == 1.0 and stats.drafted == 0


def test_ngram_drafter_copies_repeated_text(checkpoints):
    from edge.decoding.drafters import DraftSampler, NGramDrafter
    from edge.decoding.sampling import SamplingParams

    drafter = NGramDrafter(max_ngram=3)
    sampler = DraftSampler(SamplingParams(), torch.Generator())
    tokens = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    assert drafter.propose(tokens, 3, sampler).tokens == [8, 9, 1]
    assert drafter.propose(tokens + [8, 9, 1, 2, 5], 2, sampler).tokens == [6, 7]
    assert drafter.propose([1, 2, 3], 4, sampler).tokens == []


@pytest.mark.parametrize("name", ["early-exit:2", "small", "ngram", "feature"])
def test_seeded_speculative_sampling_is_reproducible(checkpoints, name):
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec(name, checkpoints))
    options = dict(max_new_tokens=30, ignore_eos=True, temperature=0.8, top_p=0.9, top_k=40, min_p=0.02,
                   repetition_penalty=1.2)
    a = ids_of(engine.generate(PROMPTS[1], seed=3, **options))
    b = ids_of(engine.generate(PROMPTS[1], seed=3, **options))
    assert a == b and len(a) == 30


def test_adaptive_drafter_remembers_the_best_choice_per_task(checkpoints, tmp_path):
    from edge.decoding.drafters import AdaptiveLayerSkipDrafter
    from edge.sources.loading import load_model

    model = load_model(checkpoints["target"])
    memory = tmp_path / "skip-memory.json"
    drafter = AdaptiveLayerSkipDrafter(model, KVCache.for_model(model.config, 64), memory_path=memory)
    drafter.set_task("code")
    names = list(drafter.candidates)
    for index, name in enumerate(names * drafter.warmup_trials):
        drafter.current = drafter._choose()
        drafter.observe(accepted=3 if drafter.current == names[-1] else 0, drafted=3, step_s=0.01)
    assert drafter.best() == names[-1]
    drafter.save()
    again = AdaptiveLayerSkipDrafter(model, KVCache.for_model(model.config, 64), memory_path=memory)
    again.set_task("code")
    assert again.best() == names[-1]
    assert set(json.loads(memory.read_text())) >= {"code"}


def test_adaptive_layer_skip_skips_the_layers_its_model_measures_least_influential(checkpoints):
    from edge.model.calibration import CALIBRATION_TEXT
    from edge.decoding.drafters.skip_calibration import layer_influence, skip_sets

    engine = Engine.load(checkpoints["target"], max_context=256, drafter="adaptive")
    model = engine.model
    influence = layer_influence(model, engine.tokenizer.encode(CALIBRATION_TEXT))
    assert len(influence) == model.config.num_layers and all(0.0 <= value <= 2.0 for value in influence)
    # the measure: 1 - cos(input, output) of each layer's residual update, as a layer-by-layer pass computes it
    ids = torch.tensor([engine.tokenizer.encode(CALIBRATION_TEXT)])
    x = model.embed(ids).float()
    rope, cache = model.rope(0, ids.shape[1], x.dtype), KVCache.for_model(model.config, ids.shape[1])
    with torch.no_grad():
        for layer, block in enumerate(model.layers):
            out = block(x, layer, 0, cache, rope, model.mask(0, ids.shape[1], model.config.window(layer)))
            expected = 1 - torch.nn.functional.cosine_similarity(x, out, dim=-1).mean().item()
            assert influence[layer] == pytest.approx(expected, abs=1e-4), layer
            x = out
    chosen = skip_sets(influence, (0.25, 0.5))
    inner = sorted(range(1, len(influence) - 1), key=influence.__getitem__)
    assert chosen[-1] == sorted(inner[:round(len(influence) * 0.5)])  # the least influential, ends kept
    skip_names = {name for name in engine.drafter.candidates if name.startswith("skip:")}
    assert skip_names == {"skip:" + ",".join(map(str, s)) for s in skip_sets(influence, (1 / 8, 1 / 4, 1 / 3))}
    fast = ids_of(engine.generate(PROMPTS[0], max_new_tokens=24, ignore_eos=True, temperature=0.0))
    plain = ids_of(Engine.load(checkpoints["target"], max_context=256).generate(PROMPTS[0], max_new_tokens=24,
                                                                                ignore_eos=True, temperature=0.0))
    assert fast == plain


def test_bad_speculation_settings_are_clear_errors(checkpoints, tmp_path, tokenizer_dir, caplog):
    target = checkpoints["target"]
    for spec, needle in [("skip:0,1,2", "every layer"), ("skip:", "skips no layer"), ("skip:7", "not in the model"),
                         ("early-exit:3", "exit layer"), ("early-exit:0", "exit layer"), ("telepathy", "unknown drafter"),
                         ("early-exit:x", "cannot read")]:
        with pytest.raises(SamplingError) as error:
            Engine.load(target, drafter=spec)
        assert needle in str(error.value) and "\n" not in str(error.value)
    for length in [0, -2, "many"]:
        with pytest.raises(SamplingError) as error:
            Engine.load(target, drafter="ngram", draft_length=length)
        assert "draft length" in str(error.value)

    other_tokenizer = tmp_path / "other-tokenizer"
    shutil.copytree(tokenizer_dir, other_tokenizer)
    data = json.loads((other_tokenizer / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[100:102]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other_tokenizer / "tokenizer.json").write_text(json.dumps(data))
    mismatched = build_checkpoint(tmp_path / "mismatched", "llama2", other_tokenizer, num_hidden_layers=1)
    with pytest.raises(TokenizerError) as error:
        Engine.load(target, drafter=f"draft:{mismatched}")
    assert "tokenizer differs" in str(error.value)

    bigger = build_checkpoint(tmp_path / "bigger", "llama3", tokenizer_dir, num_hidden_layers=5)
    with caplog.at_level(logging.WARNING):
        engine = Engine.load(target, drafter=f"draft:{bigger}")
    assert "not smaller" in caplog.text
    assert len(ids_of(engine.generate(PROMPTS[0], max_new_tokens=5, ignore_eos=True, temperature=0.0))) == 5


def test_a_feature_drafter_must_belong_to_its_target(checkpoints, tmp_path, tokenizer_dir):
    other_target = build_checkpoint(tmp_path / "other-target", "llama3", tokenizer_dir, seed=9)
    foreign = build_feature_drafter(other_target, tmp_path / "foreign-feature")
    for spec, needle in [(f"feature:{foreign}", "trained for another target"),
                         (f"feature:{checkpoints['small']}", "not a feature drafter"),
                         (f"feature:{tmp_path / 'missing'}", "does not exist")]:
        with pytest.raises(EdgeError) as error:
            Engine.load(checkpoints["target"], drafter=spec)
        assert needle in str(error.value) and "\n" not in str(error.value), spec


def test_a_packed_feature_drafter_drafts_as_trained_and_is_found_by_its_target(checkpoints, reference, tmp_path,
                                                                               tokenizer_dir, monkeypatch):
    """train.pack_feature_drafter: 16-bit weights, no embedding (probe rows instead), its trimmed vocabulary inside;
    `--drafter feature` takes the packed drafter whose card names the target's vocabulary."""
    from edge.decoding import registry
    from train.pack_feature_drafter import main as pack

    kept = sorted(set(range(0, 320, 2)) | {1})
    (tmp_path / "vocab.json").write_text(json.dumps({"kept_ids": kept}))
    packed = tmp_path / "target-feature"
    pack([str(checkpoints["feature"]), "--target", str(checkpoints["target"]), "--out", str(packed),
          "--vocab", str(tmp_path / "vocab.json")])
    assert (packed / "model.safetensors").stat().st_size < (checkpoints["feature"] / "model.safetensors").stat().st_size
    monkeypatch.setattr(registry, "shipped_feature_drafters", lambda: [tmp_path / "elsewhere", packed])
    engine = Engine.load(checkpoints["target"], max_context=512, draft_length=3, drafter="feature")
    assert engine.drafter.head is not None and engine.drafter.head.kept.tolist() == kept  # vocab.json applied
    accepted = 0
    for prompt in PROMPTS:
        engine.reset()
        events = list(engine.generate(prompt, max_new_tokens=160, ignore_eos=True, temperature=0.0))
        assert ids_of(events) == reference[prompt]
        accepted += events[-1].stats.accepted
    assert accepted > 0
    other_target = build_checkpoint(tmp_path / "other-target", "llama3", tokenizer_dir, seed=9)
    with pytest.raises(EdgeError, match="trained for another target"):
        Engine.load(other_target, drafter=f"feature:{packed}")


def test_the_target_keeps_the_features_of_every_position_it_computed(checkpoints):
    engine = Engine.load(checkpoints["target"], max_context=128, drafter=f"feature:{checkpoints['feature']}")
    tokens = ids_of(engine.generate(PROMPTS[0], max_new_tokens=20, ignore_eos=True, temperature=0.0))
    history = engine.history
    model = engine.model
    kept = model.features[:len(history) - 1].clone()  # written by the prefill and the verify passes
    hidden = model(torch.tensor([history[:-1]]), 0, model.new_cache(128))[0]  # (T, D): one pass over the same tokens
    assert len(tokens) == 20 and torch.allclose(kept, hidden, atol=1e-4)


def test_half_precision_speculation_warns_that_it_may_not_be_exact(checkpoints, caplog):
    with caplog.at_level(logging.WARNING):
        Engine.load(checkpoints["target"], dtype="bfloat16", drafter="ngram")
    assert "not guaranteed token-identical" in caplog.text


def test_draft_length_parses_adaptive_fixed_and_a_confidence_stop():
    from edge.engine.drafting import draft_length
    from edge.decoding.speculative import DraftLength

    fixed = DraftLength.fixed(5)
    fixed.update(0, 5, draft_s=0.001, verify_s=0.01)
    assert fixed.k == 5 and fixed.costs.verify == {}  # a fixed length measures nothing and never moves
    engine_default = draft_length("adaptive")  # what --draft-length adaptive (the default) starts from
    assert engine_default.adaptive and engine_default.k == 2 and engine_default.max_k == 12
    assert engine_default.stop_below is None
    stopping = DraftLength.parse("adaptive:0.3")  # adaptive, and a draft stops below probability 0.3
    assert stopping.adaptive and stopping.k == 2 and stopping.stop_below == 0.3
    assert DraftLength.parse("5") == DraftLength.parse(5) == DraftLength.fixed(5)
    for bad in ("adaptive:1.5", "adaptive:x", "adaptive:0", "soon", "cost"):
        with pytest.raises(SamplingError, match="draft length"):
            DraftLength.parse(bad)


def test_adaptive_draft_length_follows_measured_verify_costs_and_explores_one_row_at_a_time():
    import dataclasses

    from edge.decoding.speculative import DraftLength

    length = DraftLength.parse("adaptive")
    assert length.adaptive and length.k == 2
    assert dataclasses.replace(length).costs is length.costs  # every reply of an engine shares the measured costs

    def verify_seconds(rows: int) -> float:  # memory-bound: flat to 4 rows, then the weights are read twice
        return 0.020 if rows <= 4 else 0.036

    chosen = []
    for _ in range(30):
        drafted = length.k
        accepted = drafted if len(chosen) % 3 else 0  # two of three drafts wholly accepted
        length.update(accepted, drafted, draft_s=0.0005 * drafted, verify_s=verify_seconds(drafted + 1),
                      pausable=False)  # the length rule alone (the pause has its own test)
        chosen.append(length.k)
    assert max(chosen) == 4 and sorted(length.costs.verify) == [3, 4, 5]  # tried 5 rows once, and went back
    assert chosen[-5:] == [3] * 5  # the longest draft whose verify pass still costs one step
    flat = DraftLength.parse("adaptive")  # when every row count costs the same, drafting longer always pays
    for _ in range(6):
        flat.update(flat.k, flat.k, draft_s=0.0, verify_s=0.02, pausable=False)
    assert flat.k == 8 and max(flat.costs.verify) == 8  # one row further per step, never a jump
    by_acceptance = DraftLength.parse("adaptive")  # without timings (sampling: a seed must reproduce the output)
    by_acceptance.update(2, 2)
    assert by_acceptance.k == 3 and by_acceptance.costs.verify == {}  # +1 after a wholly accepted draft
    by_acceptance.update(0, 3)
    assert by_acceptance.k == 1  # the accepted tokens + 1


def test_an_adaptive_length_pauses_where_drafting_does_not_pay_and_probes_again():
    """Where a plain step (measured when the drafter had nothing to propose) makes tokens faster than any draft is
    expected to, the length pauses at 0 (plain decoding), then drafts again after PROBE_EVERY plain steps; a drafter
    that pays again resumes."""
    from edge.decoding.speculative import PLAIN_PROBE_AFTER, PROBE_EVERY, DraftLength

    length = DraftLength.parse("adaptive")
    length.update(0, 0, draft_s=0.0, verify_s=0.010)  # nothing proposed: a plain step, 10 ms
    drafts = 0
    while length.k and drafts < 4:  # a draft costs a 19 ms verify pass plus 2 ms a token, and is seldom accepted
        length.update(0, length.k, draft_s=0.002 * length.k, verify_s=0.019)
        drafts += 1
    assert length.k == 0
    for _ in range(PROBE_EVERY - 1):
        length.update(0, 0, draft_s=0.0, verify_s=0.010)
        assert length.k == 0
    length.update(0, 0, draft_s=0.0, verify_s=0.010)
    assert length.k >= 1  # drafting again, to measure anew
    per_token = length.costs.draft_per_token
    # the first draft after the pause also caught up on the 32 skipped tokens: not what a drafted token costs
    length.update(length.k, length.k, draft_s=0.050, verify_s=0.011)
    assert length.costs.draft_per_token == per_token
    for _ in range(12):  # now every draft is accepted and cheap: drafting pays, and the length stays on
        length.update(length.k, length.k, draft_s=0.0001 * length.k, verify_s=0.011)
    assert length.k >= 2
    always = DraftLength.parse("adaptive")  # a drafter that always proposes: one plain step is measured
    for _ in range(PLAIN_PROBE_AFTER):
        always.update(0, always.k, draft_s=0.002 * always.k, verify_s=0.019)
    assert always.k == 0 and 1 not in always.costs.verify
    always.update(0, 0, draft_s=0.0, verify_s=0.010)
    assert always.costs.verify[1] == 0.010
    lookup = DraftLength.parse("adaptive")  # n-gram lookup (pausable=False) keeps drafting on the same costs
    lookup.update(0, 0, draft_s=0.0, verify_s=0.010)
    for _ in range(4):
        lookup.update(0, lookup.k, draft_s=0.002 * lookup.k, verify_s=0.019, pausable=False)
        assert lookup.k >= 1


def test_a_draft_model_with_a_short_window_stays_lossless(checkpoints):
    """The drafter's cache holds 24 positions while the sequence grows past 100: it restarts its window (at
    shifted positions) several times, and the output is still the target's own."""
    plain = Engine.load(checkpoints["target"], max_context=512)
    windowed = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec("self", checkpoints),
                           draft_length=3, draft_context=24)  # the target as its own drafter, but short-sighted
    assert windowed.drafter.cache.max_len == 24
    for prompt in PROMPTS[:2]:
        plain.reset(), windowed.reset()
        expected = [t for e in plain.generate(prompt, max_new_tokens=100, ignore_eos=True, temperature=0.0) for t in e.token_ids]
        events = list(windowed.generate(prompt, max_new_tokens=100, ignore_eos=True, temperature=0.0))
        assert [t for e in events for t in e.token_ids] == expected
        assert events[-1].stats.accepted > 0
    with pytest.raises(EdgeError, match="draft context must be"):
        Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec("small", checkpoints),
                    draft_length=3, draft_context=6)



def test_a_draft_model_reads_only_the_newest_tokens_of_a_long_prompt(checkpoints, monkeypatch):
    """A prompt longer than the drafter's catch-up: it starts from the prompt's newest tokens instead of reading all
    of them; each later step adds only what is new, and the output is the target's own."""
    from edge.decoding.drafters import draft_model

    fed = []
    one_call = draft_model.draft_greedy
    monkeypatch.setattr(draft_model, "draft_greedy",
                        lambda model, request: fed.append(len(request.tokens)) or one_call(model, request))
    plain = Engine.load(checkpoints["target"], max_context=512)
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=drafter_spec("self", checkpoints),
                         draft_length=3)
    engine.drafter.catch_up = 20
    prompt = PROMPTS[0] * 3
    expected = ids_of(plain.generate(prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0))
    events = list(engine.generate(prompt, max_new_tokens=40, ignore_eos=True, temperature=0.0))
    assert ids_of(events) == expected
    assert events[-1].stats.accepted > 0
    assert len(engine.tokenizer.encode(prompt)) > 20
    assert fed[0] == 20 and max(fed) <= 20  # never the whole prompt


def test_hybrid_drafter_uses_lookup_where_text_repeats_and_the_model_elsewhere(checkpoints, reference):
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=f"hybrid:draft:{checkpoints['target']}")
    assert engine.drafter.name == "hybrid:draft-model"
    for prompt in PROMPTS:
        engine.reset()
        assert ids_of(engine.generate(prompt, max_new_tokens=160, ignore_eos=True, temperature=0.0)) == reference[prompt]
    assert engine.drafter.lookups > 0 and engine.drafter.model_drafts > 0


@pytest.mark.parametrize("name", ["feature", "hybrid:feature"])
def test_a_trimmed_feature_drafter_stays_lossless(checkpoints, reference, name, tmp_path):
    kept = sorted(set(range(0, 320, 2)) | {1})
    (tmp_path / "vocab.json").write_text(json.dumps({"kept_ids": kept}))
    engine = Engine.load(checkpoints["target"], max_context=512, draft_length=3,
                         drafter=f"{drafter_spec(name, checkpoints)}@{tmp_path / 'vocab.json'}")
    for prompt in PROMPTS:
        engine.reset()
        assert ids_of(engine.generate(prompt, max_new_tokens=160, ignore_eos=True, temperature=0.0)) == reference[prompt]
    assert engine.memory_footprint()["drafter"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["small", "feature", "early-exit:2", "skip:1", "small@", "feature@",
                                  "early-exit:2@"])
def test_one_call_greedy_drafting_drafts_what_step_by_step_drafting_does(checkpoints, name, tmp_path, monkeypatch):
    """Also with a trimmed head (NAME@): the one C call maps the kept rows back to token ids as the Python path does;
    and with a confidence stop, both stop before the same token."""
    from edge.decoding.drafters.base import DraftSampler
    from edge.decoding.sampling import SamplingParams
    from edge.kernels.runner import KernelRunner

    spec = drafter_spec(name.removesuffix("@"), checkpoints)
    kept = None
    if name.endswith("@"):
        kept = sorted(set(range(0, 320, 3)) | {1, 2})  # a third of the target's 320 tokens
        (tmp_path / "vocab.json").write_text(json.dumps({"kept_ids": kept}))
        spec += f"@{tmp_path / 'vocab.json'}"
    engine = Engine.load(checkpoints["target"], max_context=512, drafter=spec, draft_length=4)
    list(engine.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True, temperature=0.0))
    tokens, vocab = engine.history, engine.model.config.vocab_size
    one_call_path = KernelRunner.draft
    calls = {"fast": 0, "slow": 0}
    original = engine.drafter.__class__._step

    def drafts_by_both_paths(stop_below: float | None) -> list[tuple[list[int], list[float]]]:
        sampler = DraftSampler(SamplingParams(temperature=0.0), torch.Generator(), stop_below, vocab)
        assert sampler.plain_greedy
        found = []
        for end in range(len(tokens) - 12, len(tokens)):
            drafts = {}
            for path in ("fast", "slow"):  # the slow path: the one-call draft unavailable, as without the C kernel
                monkeypatch.setattr(KernelRunner, "draft", one_call_path if path == "fast" else
                                    (lambda *args, **kwargs: None))
                engine.drafter.reset()
                engine.drafter.propose(tokens[:end - 1], 1, sampler)  # caches the context, as a previous step
                engine.drafter._step = lambda *args, _path=path, _self=engine.drafter: (
                    calls.__setitem__(_path, calls[_path] + 1), original(_self, *args))[1]
                drafts[path] = engine.drafter.propose(tokens[:end], 5, sampler)
                del engine.drafter._step
            assert drafts["fast"].tokens == drafts["slow"].tokens, end
            assert kept is None or set(drafts["fast"].tokens) <= set(kept)
            found.append((drafts["slow"].tokens, drafts["slow"].confidences))
        return found

    assert all(len(draft) == 5 for draft, _ in drafts_by_both_paths(None))
    assert calls["fast"] == 0 and calls["slow"] == 12 * 5  # the one-call path never stepped from Python
    scored = drafts_by_both_paths(0.0)  # a stop that never fires, but has the confidences computed
    # a threshold between the middle confidences of later draft tokens makes some drafts stop early and not others
    # (between two of them: the C kernel's probability may differ from torch's in the last bits)
    ranked = sorted(confidence for _, confidences in scored for confidence in confidences[1:])
    stop = (ranked[len(ranked) // 2] + ranked[len(ranked) // 2 + 1]) / 2
    stopped = [len(draft) for draft, _ in drafts_by_both_paths(stop)]
    assert min(stopped) < 5 and max(stopped) > 1, stopped


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("name", ["small", "feature", "hybrid:feature"])
def test_model_drafters_on_a_quantized_target_stay_lossless(checkpoints, name, weights):
    """The target's layers in int8 or int4 (edge/model/packed_weights.py): a draft model and a feature drafter (which
    reads the target's features and head) still reproduce the quantized target's own plain decoding."""
    plain = Engine.load(checkpoints["target"], max_context=512, weights=weights)
    fast = Engine.load(checkpoints["target"], max_context=512, weights=weights,
                       drafter=drafter_spec(name, checkpoints))
    for prompt in PROMPTS:
        expected = ids_of(plain.generate(prompt, max_new_tokens=120, ignore_eos=True, temperature=0.0))
        assert ids_of(fast.generate(prompt, max_new_tokens=120, ignore_eos=True, temperature=0.0)) == expected, (name, prompt)
