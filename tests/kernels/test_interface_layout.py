"""The C kernel's one header (edge/kernels/csrc/interface.h) as Python reads it through cffi, held to the compiler's
reading: every struct's size, every field's offset and size, every enum constant's value. A field added on one side
only must fail here, not corrupt memory; the test plants such a mismatch to show that it is reported. The block
formats' structs are also held to blocks.h's table and to the gguf package's block sizes and type numbers."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edge.kernels import cpu_paths
from edge.kernels.block_formats import FORMATS, QUANTIZED
from edge.kernels.cpu_kernel import HEADER, enum_constants, ffi, interface

ROOT = Path(cpu_paths.SOURCE_DIR).parents[2]  # the checkout: edge/kernels/csrc
CROSS, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
AARCH64 = (CROSS, [QEMU, "-L", "/usr/aarch64-linux-gnu"]) if CROSS and QEMU else None


def structs(parsed) -> list[str]:
    """The struct typedefs cffi read from the header."""
    return sorted(name for name in parsed.list_types()[0] if parsed.typeof(name).kind == "struct")


def cffi_layout(parsed) -> dict[str, tuple[int, ...]]:
    """{"Name": (size,), "Name.field": (offset, size), "CONSTANT": (value,)} as cffi lays the header out."""
    layout: dict[str, tuple[int, ...]] = {}
    for name in structs(parsed):
        layout[name] = (parsed.sizeof(name),)
        for field, info in parsed.typeof(name).fields:
            layout[f"{name}.{field}"] = (info.offset, parsed.sizeof(info.type))
    layout.update({name: (value,) for name, value in enum_constants(parsed).items()})
    return layout


def layout_program(parsed) -> str:
    """A C program that prints the compiler's layout of every struct and constant cffi_layout() lists."""
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "interface.h"', "int main(void) {"]
    for name in structs(parsed):
        lines.append(f'    printf("{name} %zu\\n", sizeof({name}));')
        for field, _ in parsed.typeof(name).fields:
            lines.append(f'    printf("{name}.{field} %zu %zu\\n", offsetof({name}, {field}), '
                         f"sizeof((({name} *)0)->{field}));")
    for constant in enum_constants(parsed):
        lines.append(f'    printf("{constant} %lld\\n", (long long){constant});')
    return "\n".join([*lines, "    return 0;", "}", ""])


def compiler_layout(parsed, tmp_path: Path, target: tuple | None = None) -> dict[str, tuple[int, ...]]:
    """The layout the system compiler (or `target`'s: a cross compiler and the emulator that runs its programs)
    gives the header, for the names `parsed` lists."""
    source, program = tmp_path / "layout.c", tmp_path / "layout"
    source.write_text(layout_program(parsed))
    compiler, runner = target or (cpu_paths.compiler(), [])
    subprocess.run([compiler, f"-I{cpu_paths.SOURCE_DIR}", str(source), "-o", str(program)], check=True, timeout=120)
    output = subprocess.run([*runner, str(program)], capture_output=True, text=True, check=True, timeout=60).stdout
    return {name: tuple(map(int, values)) for name, *values in (line.split() for line in output.splitlines())}


def mismatches(parsed, tmp_path: Path) -> list[str]:
    """Every struct, field or constant where cffi's reading (`parsed`) and the compiler's reading of the header
    differ, or that only one of them has (the program names what the real header declares)."""
    ours, compiled = cffi_layout(parsed), compiler_layout(ffi, tmp_path)
    return sorted(name for name in ours.keys() | compiled.keys() if ours.get(name) != compiled.get(name))


def test_cffi_reads_every_struct_as_the_compiler_lays_it_out(tmp_path):
    assert {"ModelView", "LayerWeights", "DraftArgs", "HierarchicalPlanes", "HierarchicalCache", "BlockMatrix",
            "block_q4_k", "group_q4_k", "group_q6_k", "run_q6_k"} <= set(structs(ffi))
    assert mismatches(ffi, tmp_path) == []


@pytest.mark.skipif(AARCH64 is None, reason="needs gcc-aarch64-linux-gnu and qemu-user")
def test_aarch64_lays_the_structs_out_as_this_machine_does(tmp_path):
    """The header means the same bytes on an aarch64 machine (a Raspberry Pi, Apple, Graviton) as here."""
    assert compiler_layout(ffi, tmp_path, AARCH64) == cffi_layout(ffi)


@pytest.mark.parametrize("plant, reported", [
    (("int32_t format;", "int64_t format;"), "ModelView.format"),  # a field's type changed on the Python side only
    (("float stop_below;", "float stop_below; int32_t extra;"), "DraftArgs.extra"),  # added there only (in padding)
    (("    int32_t draft;", "    int64_t draft;"), "HierarchicalCache.draft"),
    (("uint16_t d[BLOCKS_GROUP], dmin[BLOCKS_GROUP];\n} group_q4_k;", "uint16_t d[BLOCKS_GROUP];\n} group_q4_k;"),
     "group_q4_k"),
    (("WEIGHTS_BLOCKS = 5", "WEIGHTS_BLOCKS = 4"), "WEIGHTS_BLOCKS"),
    (("int64_t R, rope_stride;", "int64_t R;"), "ModelView.rope_stride"),  # a field dropped there only
    (("    SLOT_POST_ATTN_NORM,  /* (D) */\n", ""), "SLOT_POST_FFN_NORM"),  # a slot dropped: the later ones move
    (("ACTIVATION_GELU_TANH = 1", "ACTIVATION_GELU_TANH = 2"), "ACTIVATION_GELU_TANH"),
])
def test_a_mismatch_planted_on_one_side_is_reported(tmp_path, plant, reported):
    """cffi reads a header changed in one place; the compiler reads the real one: the comparison names the change."""
    old, new = plant
    text = HEADER.read_text()
    assert old in text
    planted = interface(text.replace(old, new, 1))
    assert reported in mismatches(planted, tmp_path)


def test_the_block_structs_have_the_sizes_of_the_table_and_the_file():
    """group_* are blocks.h's table (the _Static_asserts check it as the library compiles; this reads the table
    itself), block_* ggml's file blocks (the gguf package's sizes), BlockType ggml's type numbers."""
    gguf = pytest.importorskip("gguf")
    table = (cpu_paths.SOURCE_DIR / "blocks.h").read_text()
    for name in QUANTIZED:
        fmt = FORMATS[name]
        quoted = re.search(rf"\*\s+{name.upper()}\s.*?=\s*(\d+)", table, re.S)
        assert quoted and int(quoted.group(1)) == fmt.group_bytes == ffi.sizeof(f"group_{name}"), name
        ggml = gguf.GGMLQuantizationType[name.upper()]
        assert fmt.number == ggml.value
        assert (fmt.weights, fmt.file_bytes) == gguf.GGML_QUANT_SIZES[ggml], name


def test_a_planted_size_breaks_the_build(tmp_path):
    """The _Static_asserts beside the structs: a group struct one field short does not compile."""
    text = HEADER.read_text().replace("uint16_t d[BLOCKS_GROUP], m[BLOCKS_GROUP];\n} group_q4_1;",
                                      "uint16_t d[BLOCKS_GROUP];\n} group_q4_1;", 1)
    (tmp_path / "interface.h").write_text(text)
    (tmp_path / "check.c").write_text('#include "interface.h"\n')
    result = subprocess.run([cpu_paths.compiler(), "-fsyntax-only", f"-I{tmp_path}", str(tmp_path / "check.c")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "Q4_1" in result.stderr


def test_no_struct_or_constant_of_the_interface_is_restated_in_python():
    """The bindings come from the header: no ctypes structs or argument lists in edge/."""
    for path in (ROOT / "edge").rglob("*.py"):
        text = path.read_text()
        assert "_fields_" not in text and "argtypes" not in text and "ctypes.Structure" not in text, path
