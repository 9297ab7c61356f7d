"""edge's CPU kernel on aarch64 (the neon path, with and without the dot-product extension): cross-compiled with
Debian's aarch64 toolchain and run under qemu-user through a small C driver (tests/kernels/csrc/kernel_driver.c), on an
x86 machine. Checks what the ARM code computes: float results close to torch, int8 and block-format results
bit-identical to this machine's own path, and every path's rows batch-invariant.

Needs gcc-aarch64-linux-gnu and qemu-user (`.ci/run` installs them); skipped without them unless
EDGE_REQUIRE_AARCH64=1, which CI sets so that a missing toolchain fails instead of passing quietly.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from edge.kernels import cpu_paths
from edge.kernels.block_formats import FORMATS as BLOCK_FORMATS
from edge.kernels.block_formats import QUANTIZED, QUANTIZERS, BlockMatrix, quantize_file
from edge.kernels.cpu_kernel import CpuKernel
from edge.kernels.cpu_packing import pack_int8
from edge.kernels.kv_quant import dequantize, quantize

CROSS, QEMU, SYSROOT = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64"), "/usr/aarch64-linux-gnu"
DRIVER = Path(__file__).parent / "csrc" / "kernel_driver.c"
FLAGS = {"neon": "-march=armv8-a", "neon-dotprod": "-march=armv8.2-a+dotprod"}
missing = CROSS is None or QEMU is None or not Path(SYSROOT).is_dir()
if missing and os.environ.get("EDGE_REQUIRE_AARCH64") == "1":
    raise RuntimeError("EDGE_REQUIRE_AARCH64=1 but the aarch64 toolchain is missing: "
                       "apt-get install gcc-aarch64-linux-gnu qemu-user")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing, reason="needs gcc-aarch64-linux-gnu and qemu-user")]


@pytest.fixture(scope="module", params=list(FLAGS))
def driver(request, tmp_path_factory) -> tuple[str, Path]:
    """The driver built for one flavour, once for all of a run's test processes (pytest-xdist's workers each take
    tests of both flavours): kept beside their temporary folders under the hash of what it is built from."""
    flags = [flag for flag in cpu_paths.COMMON_FLAGS if flag not in ("-fPIC", "-shared")]  # a program, not a library
    flags += [FLAGS[request.param], f"-I{cpu_paths.SOURCE_DIR}"]
    sources = [*cpu_paths.sources(), DRIVER]
    inputs = sorted({*sources, *Path(cpu_paths.SOURCE_DIR).glob("*.h")})
    digest = hashlib.sha256(repr((CROSS, flags)).encode() + b"".join(path.read_bytes() for path in inputs))
    folder = tmp_path_factory.getbasetemp().parent / f"aarch64-driver-{request.param}-{digest.hexdigest()[:16]}"
    folder.mkdir(exist_ok=True)
    program = folder / f"kernel-driver-{request.param}"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building it: wait for its program
        if not program.is_file():
            build_driver(folder, program, flags, sources)
    return request.param, program


def build_driver(folder: Path, program: Path, flags: list[str], sources: list[Path]) -> None:
    def compile_one(source: Path) -> Path:  # each file on its own core: a whole -O3 cross build is a minute of CPU
        target = folder / f"{source.stem}.o"
        subprocess.run([CROSS, *flags, "-c", str(source), "-o", str(target)], check=True, timeout=600)
        return target

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources))
    partial = program.with_suffix(".partial")
    subprocess.run([CROSS, *flags, *map(str, objects), "-o", str(partial), "-lm"], check=True, timeout=600)
    partial.rename(program)  # whole or absent


def run(program: Path, arguments: list, payload: list[torch.Tensor], outputs: int) -> tuple[str, torch.Tensor]:
    """The driver's path name and its float32 output (its two halves: the whole call, then one row per call)."""
    data = b"".join(t.contiguous().numpy().tobytes() for t in payload)
    result = subprocess.run([QEMU, "-L", SYSROOT, str(program), *map(str, arguments)], input=data,
                            capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode()
    out = torch.frombuffer(bytearray(result.stdout), dtype=torch.float32)
    assert out.numel() == 2 * outputs
    return result.stderr.decode().strip(), out


PACK = {"i8": pack_int8}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@pytest.mark.parametrize("fmt", ["f32", "bf16", "f16", "i8"])
@pytest.mark.parametrize("shape", [(40, 64), (37, 83), (172, 200)])  # (N, K)
def test_matmul_on_aarch64(driver, fmt, shape):
    name, program = driver
    rows, (n, k) = 6, shape
    generator = torch.Generator().manual_seed(n + k)
    weight, bias = torch.randn(n, k, generator=generator) * 0.1, torch.randn(n, generator=generator)
    x = torch.randn(rows, k, generator=generator)
    stored = PACK[fmt](weight) if fmt in PACK else weight.to(DTYPES[fmt])
    raw = stored.view(torch.uint8) if stored.dtype != torch.float32 else stored
    path, out = run(program, ["matmul", fmt, rows, n, k, 1], [x, raw, bias], rows * n)
    assert path == name
    whole, single = out[: rows * n].view(rows, n), out[rows * n:].view(rows, n)
    assert torch.equal(whole, single), "a row's result depends on the rows beside it"
    if fmt in PACK:  # integer sums and one scalar epilogue: the same bits as this machine's path
        host = CpuKernel.load().quantized(x, stored, "int8", n, bias)
        assert torch.equal(whole, host)
    else:
        torch.testing.assert_close(whole, F.linear(x, stored.float(), bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", QUANTIZED)
def test_block_formats_on_aarch64(driver, name):
    """llama.cpp's block formats (csrc/matmul_blocks.c): the ARM code gives this machine's bits exactly, and each row
    alone what it gives beside others."""
    from tests.kernels.test_block_formats import random_file

    _, program = driver
    rows, n, k = 5, 40, 512
    data = random_file(name, n, k, seed=9)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(10))
    _, out = run(program, ["blocks", BLOCK_FORMATS[name].number, rows, n, k], [x, torch.from_numpy(data)], rows * n)
    whole, single = out[: rows * n].view(rows, n), out[rows * n:].view(rows, n)
    assert torch.equal(whole, single), "a row's result depends on the rows beside it"
    assert torch.equal(whole, CpuKernel.load().blocks(x, BlockMatrix.from_file(name, data, n, k)))



@pytest.mark.parametrize("name", QUANTIZERS)
def test_own_quantizer_on_aarch64(driver, name):
    """edge's own quantization (csrc/blocks_quantize.c) writes on ARM the bytes it writes here."""
    from tests.kernels.test_block_formats import awkward_weights

    _, program = driver
    weight = awkward_weights()
    rows, columns = weight.shape
    arguments = ["quantize", BLOCK_FORMATS[name].number, rows, columns]
    result = subprocess.run([QEMU, "-L", SYSROOT, str(program), *map(str, arguments)],
                            input=weight.numpy().tobytes(), capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == quantize_file(name, weight).tobytes()


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("kv_heads, dim, start", [(2, 64, 21), (1, 24, 9)])
def test_attention_on_aarch64(driver, window, kv_heads, dim, start):
    _, program = driver
    heads, steps = 4, 5
    generator = torch.Generator().manual_seed(dim + start)
    q = torch.randn(heads, steps, dim, generator=generator)
    keys = torch.randn(kv_heads, start + steps, dim, generator=generator)
    values = torch.randn(kv_heads, start + steps, dim, generator=generator)
    _, out = run(program, ["attention", heads, kv_heads, steps, dim, start, window], [q, keys, values],
                 heads * steps * dim)
    whole = out[: heads * steps * dim].view(heads, steps, dim)
    single = out[heads * steps * dim:].view(steps, heads, dim).transpose(0, 1)  # written position by position
    assert torch.equal(whole, single)
    query_pos, key_pos = torch.arange(start, start + steps)[:, None], torch.arange(start + steps)[None, :]
    allowed = key_pos <= query_pos
    if window:
        allowed &= key_pos > query_pos - window
    expected = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=allowed, enable_gqa=True)
    torch.testing.assert_close(whole, expected[0], rtol=1e-5, atol=1e-5)


def test_hierarchical_kv_cache_on_aarch64(driver):
    """The fused step's quantize-on-append stores the reference's codes, steps and lows; reads match the reference."""
    _, program = driver
    steps, kv_heads, dim = 5, 2, 64
    generator = torch.Generator().manual_seed(11)
    keys, values = torch.randn(2, steps, kv_heads, dim, generator=generator) * 3  # (T, Hkv, D) each
    data = b"".join(t.contiguous().numpy().tobytes() for t in (keys, values))
    result = subprocess.run([QEMU, "-L", SYSROOT, str(program), "hierarchical", *map(str, (steps, kv_heads, dim))],
                            input=data, capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode()
    out, offset = bytearray(result.stdout), 0

    def take(count: int, dtype: torch.dtype) -> torch.Tensor:
        nonlocal offset
        size = count * torch.empty(0, dtype=dtype).element_size()
        chunk = torch.frombuffer(out[offset:offset + size], dtype=dtype)
        offset += size
        return chunk

    slots = kv_heads * steps
    for source in (keys, values):
        expected = quantize(source.transpose(0, 1), "hierarchical")  # (Hkv, T, ...)
        for reference in expected.planes:
            assert torch.equal(take(slots * dim // 2, torch.uint8).view(kv_heads, steps, dim // 2), reference)
        assert torch.equal(take(slots, torch.float16).view(kv_heads, steps, 1), expected.scale)
        assert torch.equal(take(slots, torch.float16).view(kv_heads, steps, 1), expected.low)
    stored = quantize(keys.transpose(0, 1), "hierarchical")
    for draft in (False, True):
        read = take(slots * dim, torch.float32).view(kv_heads, steps, dim)
        assert torch.equal(read, dequantize(stored, draft=draft))
    assert offset == len(out)


def test_token_tree_attention_on_aarch64(driver):
    """Each row of a token tree computes bit for bit what a one-query pass over its own path computes."""
    _, program = driver
    heads, kv_heads, dim, start = 4, 2, 24, 9
    parents = [-1, 0, 1, 0, 3, 1]  # two branches below row 0, and one below row 1
    steps = len(parents)
    generator = torch.Generator().manual_seed(13)
    q = torch.randn(heads, steps, dim, generator=generator)
    keys = torch.randn(kv_heads, start + steps, dim, generator=generator)
    values = torch.randn(kv_heads, start + steps, dim, generator=generator)
    data = b"".join(t.contiguous().numpy().tobytes() for t in (q, keys, values, torch.tensor(parents)))
    arguments = ["tree", *map(str, (heads, kv_heads, steps, dim, start))]
    result = subprocess.run([QEMU, "-L", SYSROOT, str(program), *arguments], input=data, capture_output=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr.decode()
    tree = torch.frombuffer(bytearray(result.stdout), dtype=torch.float32).view(heads, steps, dim)
    for row in range(steps):
        path = [row]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        slots = list(range(start)) + [start + r for r in path]  # the cache, then the rows on the path in depth order
        _, out = run(program, ["attention", heads, kv_heads, 1, dim, len(slots) - 1, 0],
                     [q[:, row:row + 1], keys[:, slots], values[:, slots]], heads * dim)
        assert torch.equal(tree[:, row], out[: heads * dim].view(heads, dim)), row


def test_rows_of_several_sequences_attend_to_their_own_regions_on_aarch64(driver):
    """Continuous batching's rows (RowSlots): each row attends only to its own sequence's slots up to its own, close to
    torch's attention over that range, and bit for bit what it computes alone."""
    _, program = driver
    heads, kv_heads, dim = 4, 2, 24
    firsts = [0, 0, 16, 16, 16, 32]  # three sequences' regions of 16 slots: a decode row, a prompt chunk, two rows
    slots = [6, 7, 20, 21, 22, 35]
    steps, span = len(slots), max(slots) + 1
    generator = torch.Generator().manual_seed(17)
    q = torch.randn(heads, steps, dim, generator=generator)
    keys = torch.randn(kv_heads, span, dim, generator=generator)
    values = torch.randn(kv_heads, span, dim, generator=generator)
    _, out = run(program, ["regions", heads, kv_heads, steps, dim, span],
                 [q, keys, values, torch.tensor(slots), torch.tensor(firsts)], heads * steps * dim)
    whole, alone = out[: heads * steps * dim].view(heads, steps, dim), out[heads * steps * dim:].view(heads, steps, dim)
    assert torch.equal(whole, alone)
    for row, (first, slot) in enumerate(zip(firsts, slots)):
        seen = slice(first, slot + 1)
        expected = F.scaled_dot_product_attention(q[None, :, row:row + 1], keys[None, :, seen], values[None, :, seen],
                                                  enable_gqa=True)[0, :, 0]
        torch.testing.assert_close(whole[:, row], expected, rtol=1e-5, atol=1e-5)
