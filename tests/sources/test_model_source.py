"""Models named the way people name them: Hub ids resolve from a local Hugging Face cache offline (HF_HOME and
HF_HUB_OFFLINE honoured) in the API and every command; a download fetches only safetensors, JSON and templates.
The cache layout is built here, as huggingface_hub writes it; nothing reaches the network."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from tests.gguf_files import write_gguf

from edge import CheckpointError, Engine, LoadSpec
from edge.sources import gguf_checkpoint
from edge.sources.model_source import HubName, display_name, resolve_model
from edge.planning import plan_for
from tests.helpers import greedy

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PROMPT = "The KV cache"


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache under HF_HOME, offline, in a working folder where no org/name folder exists."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "converted")
    return tmp_path / "hf" / "hub"


def cache_repo(hub: Path, repo: str, files: dict[str, Path], revision: str = "main", commit: str = COMMIT) -> Path:
    """huggingface_hub's layout: blobs by content hash, snapshots/<commit>/ linking to them, refs/<revision>."""
    root = hub / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for name, source in files.items():
        blob = root / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    return snapshot


def checkpoint_files(folder: Path) -> dict[str, Path]:
    return {item.name: item for item in folder.iterdir()}


def test_a_hub_id_loads_from_the_cache_offline(llama_dir, hub):
    snapshot = cache_repo(hub, "org/tiny", checkpoint_files(llama_dir))
    assert resolve_model("org/tiny") == snapshot
    assert resolve_model("org/tiny@main") == snapshot and resolve_model(f"org/tiny@{COMMIT}") == snapshot
    engine = Engine.load("org/tiny", max_context=64)
    assert engine.spec.path == snapshot and display_name(engine.spec.path) == "org/tiny"
    assert greedy(engine, PROMPT, 12) == greedy(llama_dir, PROMPT, 12, max_context=64)
    assert LoadSpec.from_options("org/tiny").path == snapshot


def test_hf_hub_cache_overrides_hf_home(llama_dir, hub, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    snapshot = cache_repo(elsewhere, "org/tiny", checkpoint_files(llama_dir))
    monkeypatch.setenv("HF_HUB_CACHE", str(elsewhere))
    assert resolve_model("org/tiny") == snapshot


def test_the_commands_take_a_hub_id(llama_dir, hub, capsys):
    from bench.cli import main as bench_main
    from edge.tui.cli import app_loader, build_parser, main as chat_main

    cache_repo(hub, "org/tiny", checkpoint_files(llama_dir))
    assert chat_main(["org/tiny", "--prompt", "hi", "--max-new-tokens", "4", "--raw"]) == 0
    assert bench_main(["org/tiny", "--plan"]) == 0
    assert "\"max_context\"" in capsys.readouterr().out
    args = build_parser().parse_args(["org/tiny"])
    assert app_loader(args, LoadSpec.from_options("org/tiny")).name == "org/tiny"  # the app shows the Hub id


def test_a_missing_hub_id_offline_is_one_line_in_each_command(hub, capsys):
    from bench.cli import main as bench_main
    from edge.export.cli import main as export_main
    from edge.tui.cli import main as chat_main

    with pytest.raises(CheckpointError) as caught:
        Engine.load("org/missing")
    message = str(caught.value)
    assert "org/missing is not in the Hugging Face cache at" in message and str(hub) in message
    assert "HF_HUB_OFFLINE" in message and "\n" not in message
    assert chat_main(["org/missing", "--prompt", "hi"]) == 2
    assert export_main(["org/missing", "-o", "out.bundle", "--quiet"]) == 2
    assert bench_main(["org/missing", "--plan"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all("org/missing is not in the Hugging Face cache" in line for line in errors)


def test_a_partly_cached_snapshot_offline_says_so(llama_dir, hub):
    cache_repo(hub, "org/tiny", {"config.json": llama_dir / "config.json"})
    with pytest.raises(CheckpointError, match="only partly in the Hugging Face cache"):
        resolve_model("org/tiny")


def test_a_local_folder_wins_over_a_hub_id_of_the_same_spelling(llama_dir, hub, tmp_path):
    cache_repo(hub, "org/tiny", checkpoint_files(llama_dir))
    shutil.copytree(llama_dir, tmp_path / "org" / "tiny")
    assert resolve_model("org/tiny") == Path("org/tiny")


def test_a_download_fetches_only_safetensors_json_and_templates(llama_dir, hub, monkeypatch):
    """Online and not cached: huggingface_hub downloads, asked for what edge reads and never pickled weights."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError
    from huggingface_hub.utils import filter_repo_objects

    monkeypatch.delenv("HF_HUB_OFFLINE")
    on_the_hub = ["config.json", "generation_config.json", "model.safetensors", "consolidated.safetensors",
                  "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "README.md",
                  "original/consolidated.00.pth"]
    fetched = []

    def snapshot_download(repo_id, *, revision=None, cache_dir=None, local_files_only=False, allow_patterns=None,
                          **options):
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        fetched.extend(filter_repo_objects(on_the_hub, allow_patterns=allow_patterns))
        return str(cache_repo(Path(cache_dir), repo_id, {name: llama_dir / name for name in fetched
                                                         if (llama_dir / name).exists()}))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", lambda self, repo, revision=None: on_the_hub)
    folder = resolve_model("org/tiny", progress=False)
    assert folder.parts[-4:-1] == ("hub", "models--org--tiny", "snapshots")
    assert sorted(fetched) == ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                               "tokenizer.json", "tokenizer_config.json"]


def test_a_gguf_in_a_hub_repo_is_picked_by_tag_or_file(llama_dir, hub, tmp_path):
    files = {"tiny.Q8_0.gguf": write_gguf(llama_dir, tmp_path / "a.gguf", "q8_0"),
             "tiny.Q4_0.gguf": write_gguf(llama_dir, tmp_path / "b.gguf", "q4_0")}
    cache_repo(hub, "org/tiny-GGUF", files)
    by_tag = resolve_model("org/tiny-GGUF:Q8_0", progress=False)
    assert by_tag.name == "tiny.Q8_0" and (by_tag / "config.json").is_file()
    assert resolve_model("org/tiny-GGUF/tiny.Q4_0.gguf", progress=False).name == "tiny.Q4_0"
    with pytest.raises(CheckpointError, match=r"fits several \.gguf files .*org/tiny-GGUF:Q4_0, org/tiny-GGUF:Q8_0"):
        resolve_model("org/tiny-GGUF")
    with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE"):
        resolve_model("org/tiny-GGUF:Q5_K_M")
    assert greedy("org/tiny-GGUF:q8_0", PROMPT, 12, max_context=64) == greedy(by_tag, PROMPT, 12, max_context=64)
    plan = plan_for("org/tiny-GGUF:Q4_0", budget="1GiB")  # --plan for a Hub id naming a GGUF: its blocks' size
    assert plan.weight_dtype == "q4_0"
    assert plan.footprint.target_weights == Engine.load("org/tiny-GGUF:Q4_0", max_context=64).model.weight_bytes()


def test_a_draft_model_is_named_by_hub_id_and_tag_as_a_target_is(llama_dir, hub, tmp_path):
    """--drafter draft:org/name:Q8_0 (and a Hub id of a checkpoint folder) drafts for the target, losslessly."""
    cache_repo(hub, "org/tiny-GGUF", {"tiny.Q8_0.gguf": write_gguf(llama_dir, tmp_path / "a.gguf", "q8_0")})
    cache_repo(hub, "org/tiny", checkpoint_files(llama_dir))
    plain = greedy(llama_dir, PROMPT, 12, max_context=64)
    for drafter in ("draft:org/tiny-GGUF:Q8_0", "draft:org/tiny"):
        engine = Engine.load(llama_dir, max_context=64, drafter=drafter, draft_length=2)
        assert engine.drafter is not None and greedy(engine, PROMPT, 12) == plain, drafter


@pytest.mark.parametrize("text, expected", [
    ("org/name", HubName("org/name")),
    ("HuggingFaceTB/SmolLM2-135M-Instruct@v1.0", HubName("HuggingFaceTB/SmolLM2-135M-Instruct", revision="v1.0")),
    ("org/name-GGUF:Q4_K_M", HubName("org/name-GGUF", tag="Q4_K_M")),
    ("org/name@main/sub/model.Q4_0.gguf", HubName("org/name", revision="main", file="sub/model.Q4_0.gguf")),
    ("./org/name", None), ("org/name/extra", None), ("name", None), ("org/-bad", None), ("org/a..b", None),
])
def test_hub_names_parse_or_stay_paths(text, expected):
    assert HubName.parse(text) == expected
    if expected is not None:
        assert str(expected) == text


def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="pickled weights file, which edge never loads"):
        resolve_model(tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="is a file; pass the checkpoint folder that holds it"):
        Engine.load(tmp_path / "model.safetensors")
    assert resolve_model(tmp_path / "missing") == tmp_path / "missing"  # the loader says it does not exist
    with pytest.raises(CheckpointError, match="missing.gguf does not exist; pass an existing .gguf file"):
        Engine.load(tmp_path / "missing.gguf")
