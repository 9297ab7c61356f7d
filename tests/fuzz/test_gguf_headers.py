"""Fuzzed GGUF files: a valid tiny file (f32 or q8_0, written from the tiny llama3 checkpoint) with one to three of
its header's fields changed (counts, value types, string and array lengths, scalar values, tensor dimensions, types
and offsets), bytes overwritten in the header or the data, the file cut short or bytes inserted. Engine.load then
loads it, and a short reply runs, or it is refused in one of edge's one-line errors: never another exception, never
past the time limit, never more memory than the cap (long runs)."""

from __future__ import annotations

import itertools
import shutil
import struct

import pytest
from hypothesis import strategies as st

from edge import Engine
from edge.sources import gguf_checkpoint
from tests.fuzz import harness
from tests.fuzz.gguf_fields import Field, header_end, header_fields
from tests.gguf_files import write_gguf

LIMIT_S = 10.0  # a tiny file loads in about 0.1 s


@pytest.fixture(scope="module")
def originals(llama_dir, tmp_path_factory) -> dict[str, tuple[bytes, list[Field]]]:
    folder = tmp_path_factory.mktemp("fuzz-gguf")
    files = {qtype: write_gguf(llama_dir, folder / f"{qtype}.gguf", qtype).read_bytes() for qtype in ("f32", "q8_0")}
    return {qtype: (data, header_fields(data)) for qtype, data in files.items()}


def field_values(field: Field, current: int | float) -> st.SearchStrategy:
    """Values for `field`: the boundaries of its type, its value nudged, and anything in range."""
    code = "B" if field.format == "?" else field.format
    if code in "fd":
        return st.floats(width=32 if code == "f" else 64) | st.sampled_from([0.0, -1.0, 1e-30, 65504.0])
    bits = struct.calcsize("<" + code) * 8
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if code.islower() else (0, 2**bits - 1)
    near = [current + step for step in (-2, -1, 1, 2)] + [current * 2, current // 2, current * 2**20]
    special = [0, 1, 2, 3, 7, 13, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, low, high]
    return st.sampled_from(sorted({value for value in near + special if low <= value <= high})) | st.integers(low, high)


def mutations(data: bytes, fields: list[Field]) -> st.SearchStrategy:
    end = header_end(fields)
    field_change = st.sampled_from(range(len(fields))).flatmap(
        lambda index: st.tuples(st.just("field"), st.just(fields[index].name),
                                field_values(fields[index], fields[index].read(data))))
    return st.one_of(
        field_change, field_change, field_change,  # the most of them
        st.tuples(st.just("bytes"), st.integers(0, end - 1), st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("bytes"), st.integers(0, len(data) - 1), st.binary(min_size=1, max_size=64)),
        st.tuples(st.just("cut"), st.integers(0, len(data) - 1)),
        st.tuples(st.just("insert"), st.integers(0, end), st.binary(min_size=1, max_size=16)),
    )


def mutated(data: bytes, fields: list[Field], changes: list[tuple]) -> bytes:
    out = bytearray(data)
    by_name = {field.name: field for field in fields}
    for change in changes:
        if change[0] == "field":
            field = by_name[change[1]]
            code = "B" if field.format == "?" else field.format
            if field.offset + field.size <= len(out):
                struct.pack_into("<" + code, out, field.offset, change[2])
        elif change[0] == "bytes":
            out[change[1]:change[1] + len(change[2])] = change[2]
        elif change[0] == "cut":
            del out[change[1]:]
        else:
            out[change[1]:change[1]] = change[2]
    return bytes(out)


def test_a_fuzzed_gguf_file_loads_or_is_refused_in_one_line(originals, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: cache)
    numbers = itertools.count()
    harness.cap_memory()

    def one_file(data):
        qtype = data.draw(st.sampled_from(sorted(originals)), label="file")
        original, fields = originals[qtype]
        changes = data.draw(st.lists(mutations(original, fields), min_size=1, max_size=3), label="changes")
        path = tmp_path / f"fuzzed-{next(numbers)}.gguf"  # a new name: the conversion cache keys on the path too
        path.write_bytes(mutated(original, fields, changes))
        try:
            with harness.limited(LIMIT_S, (qtype, changes)), harness.result_or_refusal():
                engine = Engine.load(path, max_context=64)
                list(engine.generate("Hi", max_new_tokens=2))
        finally:
            path.unlink()
            shutil.rmtree(cache, ignore_errors=True)

    harness.run(one_file, data=st.data())
