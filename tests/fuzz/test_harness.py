"""The fuzz harness itself: an example past its time limit fails even where its code swallowed the timeout, a refusal
counts only as one of edge's errors on one line, and the GGUF field map finds each field where gguf's reader reads
it."""

from __future__ import annotations

import time

import pytest
from hypothesis import strategies as st

from edge.errors import CheckpointError
from tests.fuzz import harness
from tests.fuzz.gguf_fields import header_end, header_fields
from tests.gguf_files import write_gguf


def test_an_example_past_its_limit_fails_even_when_its_code_catches_the_timeout():
    with pytest.raises(harness.ExampleTimeout, match="ran past its 0.1 s limit"):
        with harness.limited(0.1, "example"):
            try:
                time.sleep(5)
            except Exception:  # noqa: BLE001 - code under test that catches everything
                pass
    with harness.limited(5, "example"):  # within its limit: nothing
        pass


@pytest.mark.parametrize("error, fails", [(CheckpointError("one line"), False), (CheckpointError("two\nlines"), True),
                                          (ValueError("not edge's"), True)], ids=["edge", "two-lines", "other"])
def test_a_refusal_counts_only_as_edges_own_error_on_one_line(error, fails):
    def example(value):
        with harness.result_or_refusal():
            raise error

    if fails:
        with pytest.raises((AssertionError, ValueError)):
            harness.run(example, value=st.just(0))
    else:
        harness.run(example, value=st.just(0))


def test_the_gguf_field_map_finds_each_field_where_the_reader_reads_it(llama_dir, tmp_path):
    from gguf import GGUFReader

    path = write_gguf(llama_dir, tmp_path / "model.gguf", "q8_0")
    data = path.read_bytes()
    fields = {field.name: field.read(data) for field in header_fields(data)}
    reader = GGUFReader(path)
    assert fields["tensor count"] == len(reader.tensors)
    assert fields["kv general.architecture length"] == len("llama")
    for tensor in reader.tensors:
        assert [fields[f"tensor {tensor.name} dim {i}"] for i in range(len(tensor.shape))] == list(tensor.shape)
        assert fields[f"tensor {tensor.name} type"] == tensor.tensor_type
    assert header_end(header_fields(data)) <= min(tensor.data_offset for tensor in reader.tensors)


@pytest.mark.slow
def test_the_runner_runs_a_target_for_its_seconds_in_a_process_of_its_own():
    import subprocess
    import sys

    from tests.fuzz.__main__ import ROOT

    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "tests.fuzz", "--seconds", "3", "--target", "chats"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fuzz chats: 3 s" in run.stdout and "fuzz chats: no failure" in run.stdout
    assert time.monotonic() - started >= 3
