"""Loading (edge/engine/loader.py) reads a checkpoint's config.json once and hands the parsed config on: to the
memory planner, the checkpoint checks, the tokenizer and load_model, for a checkpoint folder and for the folder a GGUF
file is read into."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from edge import Engine
from edge.load_spec import LoadSpec
from edge.sources import gguf_checkpoint
from tests.gguf_files import write_gguf


@pytest.fixture
def config_reads(monkeypatch) -> list[Path]:
    """Every config.json opened for reading from here on (with builtins.open or Path.open, which Path.read_text
    uses), in order."""
    reads: list[Path] = []
    real_open, real_path_open = builtins.open, Path.open

    def note(file, mode: str) -> None:
        if isinstance(file, (str, Path)) and Path(file).name == "config.json" and not set(mode) & set("wax+"):
            reads.append(Path(file).resolve())

    def counting_open(file, mode="r", *args, **kwargs):
        note(file, mode)
        return real_open(file, mode, *args, **kwargs)

    def counting_path_open(self, mode="r", *args, **kwargs):
        note(self, mode)
        return real_path_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(Path, "open", counting_path_open)
    return reads


@pytest.mark.parametrize("options", [{}, {"memory_budget": "1GiB", "drafter": "ngram"}, {"weights": "int8"},
                                     {"offload_layers": [2]}])
def test_a_checkpoint_folder_reads_its_config_json_once(llama_dir, config_reads, options):
    spec = LoadSpec.from_options(llama_dir, max_context=64, **options)
    Engine.from_spec(spec)
    assert config_reads == [(llama_dir / "config.json").resolve()]


@pytest.mark.parametrize("options", [{}, {"weights": "float16"}, {"memory_budget": "1GiB", "dtype": "bfloat16"}])
def test_a_gguf_files_folder_reads_its_config_json_once(llama_dir, tmp_path, monkeypatch, config_reads, options):
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "cache")
    spec = LoadSpec.from_options(write_gguf(llama_dir, tmp_path / "model.gguf", "q8_0"), max_context=64, **options)
    config_reads.clear()  # reading the file into a folder checked the config.json it wrote
    Engine.from_spec(spec)
    assert config_reads == [(spec.path / "config.json").resolve()]
