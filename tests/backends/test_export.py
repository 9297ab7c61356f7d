"""edge-export: checkpoint -> validated bundle -> Engine on ONNX Runtime, for every weight format and family.

The core checks are the project's invariant on this backend: greedy speculative decoding (draft model, trimmed
drafter, n-gram) equals greedy plain decoding on the same bundle; and the fp32 graph reproduces eager edge."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx")

from edge.backends.bundle import read_bundle, sealed  # noqa: E402
from edge.decoding.drafters import DraftSampler  # noqa: E402
from edge.engine import Engine  # noqa: E402
from edge.errors import BundleError, EdgeError  # noqa: E402
from edge.model.packed_weights import packed_format  # noqa: E402
from edge.decoding.sampling import SamplingParams  # noqa: E402
from edge.export.bundle import ExportOptions, export_bundle  # noqa: E402
from edge.export.cli import main as export_main  # noqa: E402
from edge.export.quantize import QuantSettings  # noqa: E402
from edge.export.vocab_trim import choose_vocabulary, covered_share  # noqa: E402
from tests.conftest import build_checkpoint  # noqa: E402
from tests.helpers import greedy  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", "import os\nfor name in", "Speculative decoding drafts"]


def export(checkpoint: Path, output: Path, weights: str = "fp32", **options) -> dict:
    settings = ExportOptions(quant=QuantSettings(weights), calibration_tokens=16, **options)
    return export_bundle(checkpoint, output, settings, show_progress=False)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("export-drafter"), "llama3", tokenizer_dir, seed=5,
                            num_hidden_layers=1)


@pytest.mark.parametrize("family", ["llama3", "llama_bias_linear_rope", "smollm", "qwen2", "qwen3", "mistral"])
def test_fp32_graph_reproduces_eager_edge(family, checkpoint_factory, tmp_path):
    checkpoint = checkpoint_factory(family)
    manifest = export(checkpoint, tmp_path / "bundle")
    assert manifest["validation"]["onnx"]["target"]["relative_error"] < 1e-4
    eager = Engine.load(checkpoint, max_context=256)
    bundled = Engine.load(tmp_path / "bundle", max_context=256)
    for prompt in PROMPTS:  # mistral: 40 + prompt tokens cross its 24-token sliding window
        assert greedy(bundled, prompt, 40) == greedy(eager, prompt, 40)


@pytest.mark.parametrize("weights", ["fp32", "fp16", "int8", "int4"])
def test_speculation_on_the_bundle_equals_plain_decoding(weights, llama_dir, drafter_dir, tmp_path):
    manifest = export(llama_dir, tmp_path / "bundle", weights, drafter=str(drafter_dir), vocab_trim="on")
    assert manifest["validation"]["onnx"]["speculative_equals_plain"]["identical"]
    assert manifest["drafter"]["vocab_map"] == "drafter/vocab_map.json"
    plain = Engine.load(tmp_path / "bundle", max_context=512)
    for drafter in ("bundle", "ngram"):
        for length in ("adaptive", 3):
            fast = Engine.load(tmp_path / "bundle", max_context=512, drafter=drafter, draft_length=length)
            for prompt in PROMPTS:
                assert greedy(fast, prompt, 96) == greedy(plain, prompt, 96), (drafter, length, prompt)


@pytest.fixture(scope="module")
def torch_bundle(tmp_path_factory, llama_dir, drafter_dir) -> Path:
    folder = tmp_path_factory.mktemp("torch-targets") / "bundle"
    manifest = export(llama_dir, folder, "int8", formats=("onnx", "torchscript"), drafter=str(drafter_dir),
                      vocab_trim="on")
    assert set(manifest["validation"]) == {"sequence_tokens", "onnx", "torchscript", "torch-export"}
    assert manifest["validation"]["torchscript"]["weights"] == "fp32"
    return folder


@pytest.mark.parametrize("backend", ["torchscript", "torch-export"])
def test_torch_targets_reproduce_eager_edge_and_speculate_exactly(backend, torch_bundle, llama_dir):
    eager = Engine.load(llama_dir, max_context=512)
    plain = Engine.load(torch_bundle, max_context=512, backend=backend)
    assert plain.backend == backend and plain.bundle.backends() == ["onnx", "torchscript", "torch-export"]
    for drafter in ("bundle", "ngram"):
        fast = Engine.load(torch_bundle, max_context=512, drafter=drafter, backend=backend)
        for prompt in PROMPTS:
            reference = greedy(plain, prompt, 64)
            assert reference == greedy(eager, prompt, 64)  # float32 weights: eager edge's tokens
            assert greedy(fast, prompt, 64) == reference, (drafter, prompt)


def test_backend_choice_errors(torch_bundle, small_bundle, llama_dir, capsys):
    with pytest.raises(BundleError, match="has no torchscript target"):
        Engine.load(small_bundle, backend="torchscript")
    with pytest.raises(EdgeError, match="runs exported bundles"):
        Engine.load(llama_dir, backend="torchscript")
    assert export_main([str(llama_dir), "-o", "unused", "--format", "torchscript", "--weights", "int8"]) == 2
    assert "applies to the ONNX target" in capsys.readouterr().err


def test_trimmed_drafter_never_drafts_a_dropped_token(llama_dir, drafter_dir, tmp_path):
    export(llama_dir, tmp_path / "bundle", drafter=str(drafter_dir), vocab_trim="on", vocab_coverage=0.5)
    engine = Engine.load(tmp_path / "bundle", max_context=256, drafter="bundle", draft_length=4)
    kept = set(engine.bundle.drafter_vocab_map().tolist())
    assert len(kept) < engine.model.config.vocab_size
    logits = engine.drafter.model.logits(engine.drafter.model(torch.tensor([[1, 2, 3]]), 0,
                                                              engine.drafter.model.new_cache(8)))  # (1, 3, V)
    dropped = torch.tensor(sorted(set(range(logits.shape[-1])) - kept))
    assert torch.isinf(logits[..., dropped]).all() and not torch.isinf(logits[..., sorted(kept)]).any()


def test_auto_trims_only_a_head_that_outweighs_the_drafter_layers(llama_dir, drafter_dir, tmp_path):
    from edge.sources.loading import load_model
    from edge.export.bundle import _should_trim

    drafter = load_model(drafter_dir)  # 1 layer of width 64 (~41k weights) against a 320 x 64 head (~20k)
    assert not _should_trim("auto", drafter) and _should_trim("on", drafter) and not _should_trim("off", drafter)
    manifest = export(llama_dir, tmp_path / "bundle", drafter=str(drafter_dir))
    assert manifest["drafter"]["vocab_map"] is None and "vocab_trim" not in manifest


def test_stochastic_speculation_runs_on_the_bundle(llama_dir, drafter_dir, tmp_path):
    export(llama_dir, tmp_path / "bundle", "int8", drafter=str(drafter_dir))
    engine = Engine.load(tmp_path / "bundle", max_context=256, drafter="bundle")
    events = list(engine.generate("The quick", max_new_tokens=32, temperature=0.8, top_p=0.9, seed=3,
                                  ignore_eos=True))
    assert sum(len(e.token_ids) for e in events) == 32 and events[-1].stats.drafted > 0


def test_manifest_lists_hashes_settings_and_memory(llama_dir, drafter_dir, tmp_path):
    manifest = export(llama_dir, tmp_path / "bundle", "int4", drafter=str(drafter_dir), vocab_trim="on")
    on_disk = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["format_version"] == 1 and manifest["quantization"] == {
        "weights": "int4", "block_size": 32, "accuracy_level": 4}
    assert set(manifest["files"]) >= {"target/model.onnx", "drafter/model.onnx", "drafter/vocab_map.json",
                                      "tokenizer.json", "target/config.json"}
    assert "model.safetensors" in manifest["source"]["files"]
    assert manifest["drafter"]["tokenizer_sha256"] == manifest["tokenizer"]["sha256"]
    assert manifest["memory"]["target_kv_bytes_per_token"] == 2 * 3 * 2 * 16 * 4  # layers, kv heads, head_dim
    assert manifest["memory"]["target_weights_bytes"] == manifest["files"]["target/model.onnx"]["bytes"]


def test_cli_exports_and_reports(llama_dir, tmp_path, capsys):
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--weights", "int8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "onnx (int8)" in out and "equals plain: yes" in out
    assert read_bundle(tmp_path / "b").manifest["quantization"]["weights"] == "int8"


# -- bad input -------------------------------------------------------------------------------------------------


def test_existing_output_is_refused_and_kept(llama_dir, tmp_path, capsys):
    output = tmp_path / "taken"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    assert export_main([str(llama_dir), "-o", str(output), "--quiet"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert export_main([str(llama_dir), "-o", str(output), "--quiet", "--overwrite"]) == 2
    assert "not an edge bundle" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "mine"


def test_failed_export_leaves_nothing_behind(llama_dir, tmp_path, monkeypatch):
    import edge.export.bundle as bundle_module

    def broken(*args, **kwargs):
        raise KeyboardInterrupt  # as if the user pressed Ctrl+C while validating

    monkeypatch.setattr(bundle_module, "validate", broken)
    with pytest.raises(KeyboardInterrupt):
        export(llama_dir, tmp_path / "bundle")
    assert list(tmp_path.iterdir()) == []


def test_unknown_architecture_is_one_clear_line(tmp_path, llama_dir, capsys):
    import shutil

    checkpoint = tmp_path / "unknown"
    shutil.copytree(llama_dir, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(model_type="nosuchmodel", architectures=["NoSuchModelForCausalLM"])
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert export_main([str(checkpoint), "-o", str(tmp_path / "b"), "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("edge-export:") and "\n" not in error and "nosuchmodel" in error.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unknown"]  # no bundle, no partial folder


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """GPT-2: an architecture edge's model file does not cover (learned positions, LayerNorm, GELU)."""
    import shutil

    import transformers

    from edge.text.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    vocab = Tokenizer.from_dir(tokenizer_dir).vocab_size
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=256, n_embd=64, n_layer=2, n_head=4,
                                     eos_token_id=vocab - 1, bos_token_id=vocab - 1)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, folder / item.name)
    return folder


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_uncovered_architecture_exports_through_optimum(weights, gpt2_dir, tmp_path):
    pytest.importorskip("optimum.exporters.onnx")
    manifest = export(gpt2_dir, tmp_path / "bundle", weights)
    assert manifest["target"]["graph"] == "optimum" and manifest["target"]["architecture"] == "gpt2"
    assert manifest["validation"]["onnx"]["speculative_equals_plain"]["identical"]
    plain = Engine.load(tmp_path / "bundle", max_context=256)
    fast = Engine.load(tmp_path / "bundle", max_context=256, drafter="ngram", draft_length=4)
    for prompt in PROMPTS:
        assert greedy(fast, prompt, 64) == greedy(plain, prompt, 64)
    if weights == "fp32":  # equal to transformers' own greedy decoding
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
        ids = plain.tokenizer.encode(PROMPTS[0], add_special_tokens=True)
        expected = hf.generate(torch.tensor([ids]), max_new_tokens=40, min_new_tokens=40, do_sample=False,
                               pad_token_id=0)[0].tolist()
        assert ids + greedy(plain, PROMPTS[0], 40) == expected  # transformers returns the prompt too


def test_bad_options_are_refused(llama_dir, tmp_path, capsys):
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--weights", "int4", "--block-size", "24"]) == 2
    assert "block size" in capsys.readouterr().err
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--vocab-coverage", "1.5"]) == 2
    assert "--vocab-coverage" in capsys.readouterr().err
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--drafter", "ngram"]) == 2
    assert "not a draft model" in capsys.readouterr().err


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory, llama_dir, drafter_dir) -> Path:
    folder = tmp_path_factory.mktemp("small") / "bundle"
    export(llama_dir, folder, "int8", drafter=str(drafter_dir))
    return folder


@pytest.mark.parametrize("draft_weights", [None, "int8"])
def test_a_torch_draft_model_drafts_for_a_bundle(small_bundle, drafter_dir, draft_weights):
    """A separate torch draft model beside the ONNX target (its layers in int8 too): lossless, and its kernel runs
    on one thread."""
    plain = Engine.load(small_bundle, max_context=256)
    fast = Engine.load(small_bundle, max_context=256, drafter=f"draft:{drafter_dir}", draft_length=3,
                       draft_weights=draft_weights)
    assert fast.drafter.model.runner.matmul is None or fast.drafter.model.runner.matmul.thread_count() == 1
    assert packed_format(fast.drafter.model) == draft_weights
    if draft_weights:  # the quantized layers use the one-thread kernel as well
        assert fast.drafter.model.layers[0].attn.wqkv.runner.matmul.thread_count() == 1
    for prompt in PROMPTS:
        assert greedy(fast, prompt, 64) == greedy(plain, prompt, 64)


def _copy(bundle: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(bundle, tmp_path / "copy"))


def test_tampered_file_is_refused(small_bundle, tmp_path):
    bundle = _copy(small_bundle, tmp_path)
    data = bytearray((bundle / "target" / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / "target" / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(BundleError, match="target/model.onnx does not match its sha256"):
        Engine.load(bundle)


def test_truncated_file_is_refused(small_bundle, tmp_path):
    bundle = _copy(small_bundle, tmp_path)
    path = bundle / "drafter" / "model.onnx"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(BundleError, match="drafter/model.onnx is 1000 bytes"):
        Engine.load(bundle, drafter="bundle")


def test_newer_format_version_is_refused(small_bundle, tmp_path):
    bundle = _copy(small_bundle, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["format_version"] = 99
    (bundle / "manifest.json").write_text(json.dumps(sealed(manifest)))
    with pytest.raises(BundleError, match="format 99, newer than this edge reads"):
        Engine.load(bundle)


def test_drafter_with_another_tokenizer_is_refused(small_bundle, tmp_path):
    bundle = _copy(small_bundle, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["drafter"]["tokenizer_sha256"] = "0" * 64
    (bundle / "manifest.json").write_text(json.dumps(sealed(manifest)))
    with pytest.raises(BundleError, match="different tokenizer"):
        Engine.load(bundle, drafter="bundle")


def edit_manifest(bundle: Path, change, *, seal: bool) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    (bundle / "manifest.json").write_text(json.dumps(sealed(manifest) if seal else manifest))


def test_an_edited_manifest_is_refused(small_bundle, tmp_path):
    """The manifest is covered by its own sha256: a block size edited in it no longer loads."""
    bundle = _copy(small_bundle, tmp_path)
    edit_manifest(bundle, lambda manifest: manifest["quantization"].update(block_size=64), seal=False)
    with pytest.raises(BundleError, match="does not match its manifest_sha256") as caught:
        Engine.load(bundle)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("change, message", [
    (lambda m: m["quantization"].update(block_size=24), "block size of 24 for its int8 weights"),
    (lambda m: m["memory"].update(target_weights_bytes=12), "counts 12 bytes of target weights"),
    (lambda m: m["memory"].update(target_kv_bytes_per_token=8), "sizes the KV cache at 8 bytes per token"),
    (lambda m: m.pop("validation"), "has no validation record"),
], ids=["block-size", "weights-bytes", "kv-bytes", "unvalidated"])
def test_a_manifest_that_disagrees_with_its_files_is_refused(small_bundle, tmp_path, change, message):
    """Even sealed again after the edit: what the manifest says is checked against the files it describes."""
    bundle = _copy(small_bundle, tmp_path)
    edit_manifest(bundle, change, seal=True)
    with pytest.raises(BundleError, match=message):
        Engine.load(bundle)


def test_a_graph_whose_shapes_disagree_with_its_config_is_refused(small_bundle, tmp_path):
    bundle = _copy(small_bundle, tmp_path)
    config = json.loads((bundle / "target" / "config.json").read_text())
    config["num_key_value_heads"] = config["num_attention_heads"]  # 2 -> 4 KV heads: not what the graph takes
    (bundle / "target" / "config.json").write_text(json.dumps(config))
    edit_manifest(bundle, lambda m: (m["files"].pop("target/config.json"),
                                     m["memory"].pop("target_kv_bytes_per_token")), seal=True)
    with pytest.raises(BundleError, match=r"gives past_key.0 the shape .* config \(3 layers, 4 KV heads"):
        Engine.load(bundle)


def test_a_bundle_without_a_drafter_names_the_drafters_that_work(small_bundle, tmp_path):
    bundle = _copy(small_bundle, tmp_path)
    edit_manifest(bundle, lambda manifest: manifest.pop("drafter"), seal=True)
    with pytest.raises(BundleError, match="holds no drafter; draft from the prompt with --drafter ngram") as raised:
        Engine.load(bundle, drafter="bundle")
    assert "\n" not in str(raised.value)
    assert Engine.load(bundle, drafter="ngram").drafter is not None  # the fix it names works


def test_the_builtin_drafter_for_another_model_is_refused_with_the_fix(llama_dir, tmp_path, capsys):
    """--drafter builtin drafts for the built-in model only: for another model, one line saying so and what works."""
    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--drafter", "builtin", "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "--drafter builtin is the built-in model's draft model" in error
    assert "Export without --drafter" in error and "--drafter ngram" in error
    assert not (tmp_path / "b").exists()


def test_layer_skip_drafters_need_the_torch_backend(small_bundle):
    with pytest.raises(EdgeError, match="needs the torch backend"):
        Engine.load(small_bundle, drafter="early-exit:1")


# -- VocabTrim selection ---------------------------------------------------------------------------------------


def test_choose_vocabulary_covers_the_share_with_the_fewest_tokens():
    counts = Counter({5: 50, 7: 30, 9: 15, 11: 5})
    assert choose_vocabulary(counts, 0.8, minimum=1) == [5, 7]
    assert choose_vocabulary(counts, 0.95, always=[0], minimum=1) == [0, 5, 7, 9]
    assert choose_vocabulary(counts, 1.0, minimum=1) == [5, 7, 9, 11]
    assert covered_share(counts, [5, 9]) == pytest.approx(0.65)
    with pytest.raises(ValueError, match="coverage"):
        choose_vocabulary(counts, 0.0)


@pytest.fixture(scope="module")
def vocab_file(llama_dir, tmp_path_factory) -> Path:
    from edge.export.vocab_trim import main as vocab_main

    path = tmp_path_factory.mktemp("vocab") / "vocab.json"
    assert vocab_main([str(llama_dir), "-o", str(path), "--coverage", "0.6", "--calibration-tokens", "16"]) == 0
    return path


@pytest.mark.parametrize("spec", ["early-exit:2", "skip:1", "adaptive", "draft"])
def test_trimmed_torch_drafters_stay_lossless(spec, vocab_file, llama_dir, drafter_dir):
    spec = f"draft:{drafter_dir}" if spec == "draft" else spec
    plain = Engine.load(llama_dir, max_context=512)
    trimmed = Engine.load(llama_dir, max_context=512, drafter=f"{spec}@{vocab_file}", draft_length=3)
    kept = set(json.loads(vocab_file.read_text())["kept_ids"])
    assert 0 < len(kept) < plain.model.config.vocab_size
    for prompt in PROMPTS:
        assert greedy(trimmed, prompt, 64) == greedy(plain, prompt, 64), (spec, prompt)
    sampler = DraftSampler(SamplingParams(), torch.Generator())
    draft = trimmed.drafter.propose(plain.tokenizer.encode(PROMPTS[0]), 4, sampler)
    assert draft.tokens and set(draft.tokens) <= kept  # drafts come from the kept tokens only
    assert trimmed.memory_footprint()["drafter"] > 0


def test_bad_draft_vocabularies_are_refused(llama_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"kept_ids": [1, 2, 999999]}')
    with pytest.raises(EdgeError, match="token ids in 0"):
        Engine.load(llama_dir, drafter=f"early-exit:1@{bad}")
    with pytest.raises(EdgeError, match="cannot read the draft vocabulary"):
        Engine.load(llama_dir, drafter=f"early-exit:1@{tmp_path / 'missing.json'}")
    good = tmp_path / "good.json"
    good.write_text("[1, 2, 3]")
    for spec in ("ngram", "hybrid:ngram"):
        with pytest.raises(EdgeError, match="has no head to trim"):
            Engine.load(llama_dir, drafter=f"{spec}@{good}")


def test_a_checkpoint_runs_on_onnx_through_the_cache(llama_dir, drafter_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    engine = Engine.load(llama_dir, max_context=256, backend="onnx", drafter=f"draft:{drafter_dir}", draft_length=3)
    assert engine.backend == "onnx" and engine.bundle.has_drafter and engine.drafter.name == "draft-model"
    cached = list((tmp_path / "cache" / "bundles").iterdir())
    assert len(cached) == 1 and engine.bundle.manifest["quantization"]["weights"] == "int8"
    plain = Engine.load(cached[0], max_context=256)
    for prompt in PROMPTS:
        assert greedy(engine, prompt, 48) == greedy(plain, prompt, 48)

    import edge.export.bundle as bundle_module

    def no_second_export(*args, **kwargs):
        raise AssertionError("the cached bundle should have been reused")

    monkeypatch.setattr(bundle_module, "export_bundle", no_second_export)
    again = Engine.load(llama_dir, max_context=256, backend="onnx", drafter="ngram")
    assert again.bundle.root == cached[0] and again.drafter.name == "ngram"


def test_the_vocabulary_file_can_come_from_the_targets_own_replies(llama_dir, tmp_path):
    """python -m edge.export.vocab_trim --replies FILE --calibration-tokens 0: the tokens of the assistant messages alone."""
    import json

    from edge.text.tokenizer import Tokenizer
    from edge.export.vocab_trim import main as vocab_main

    replies = tmp_path / "replies.jsonl"
    conversation = [{"role": "user", "content": "ignored"}, {"role": "assistant", "content": "hello world hello"}]
    replies.write_text(json.dumps({"kind": "reply", "messages": conversation}) + "\n")
    out = tmp_path / "vocab.json"
    assert vocab_main([str(llama_dir), "-o", str(out), "--replies", str(replies), "--calibration-tokens", "0",
                       "--coverage", "1.0"]) == 0
    report = json.loads(out.read_text())
    tokenizer = Tokenizer.from_dir(llama_dir)
    expected = set(tokenizer.encode("hello world hello", add_special_tokens=False))
    assert expected <= set(report["kept_ids"]) and report["calibration_tokens"] == len(
        tokenizer.encode("hello world hello", add_special_tokens=False))
    assert "ignored" not in tokenizer.decode(report["kept_ids"])
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    assert vocab_main([str(llama_dir), "-o", str(out), "--replies", str(tmp_path / "bad.jsonl")]) == 2
