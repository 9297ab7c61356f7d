"""llama.cpp's block formats in edge's kernel (edge/kernels/block_formats.py, csrc/matmul_blocks.c): a matrix rearranged
into groups holds exactly the values the gguf package dequantizes from the file's bytes; the matmul computes them
(activations quantized to 8 bits as llama.cpp does) with every row independent of the rest of the call, and every
CPU path gives the same bits."""

from __future__ import annotations

from tests import gguf_files
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.conftest import kernel_for, kernel_path_names
from gguf import GGMLQuantizationType, quants

from edge.kernels.block_formats import FORMATS, QUANTIZED, QUANTIZERS, BlockMatrix, file_bytes, packed_bytes, quantize_file
from edge.kernels.cpu_kernel import CpuKernel

pytestmark = pytest.mark.skipif(CpuKernel.load() is None, reason="no C compiler: the kernel falls back to torch")
SHAPES = [(48, 256), (37, 512)]  # (N, K); 37 rows: a part-filled group of 16


def random_file(name: str, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Random bytes in the format's file layout (rows, row bytes), every code and sub-block scale possible, with
    float16 scales of a realistic size."""
    fmt, rng = FORMATS[name], np.random.default_rng(seed)
    blocks = columns // fmt.weights
    raw = rng.integers(0, 256, size=(rows, blocks, fmt.file_bytes), dtype=np.uint8)

    def halves() -> np.ndarray:
        return rng.uniform(-0.02, 0.02, size=(rows, blocks)).astype(np.float16).view(np.uint8).reshape(rows, blocks, 2)

    if name == "q6_k":
        raw[..., 208:210] = halves()
    else:
        raw[..., 0:2] = halves()
        if name in ("q4_1", "q5_1", "q4_k", "q5_k"):
            raw[..., 2:4] = halves()
    return raw.reshape(rows, -1)


def reference(name: str, data: np.ndarray, rows: int, columns: int) -> torch.Tensor:
    values = quants.dequantize(data, GGMLQuantizationType[name.upper()])
    return torch.from_numpy(values.astype(np.float32)).reshape(rows, columns)


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_matrix_holds_exactly_the_files_values(name, shape):
    rows, columns = shape
    data = random_file(name, rows, columns)
    matrix = BlockMatrix.from_file(name, data, rows, columns)
    assert torch.equal(matrix.dequantized(), reference(name, data, rows, columns))
    assert torch.equal(matrix.dequantized(5, 3), reference(name, data, rows, columns)[5:8])
    assert matrix.nbytes == packed_bytes(name, rows, columns)
    groups_of_file = -(-rows // 16) * 16 / rows * file_bytes(name, rows, columns)
    assert matrix.nbytes <= groups_of_file * 1.03  # the file's bytes, padded to groups of 16 (k-quants: +2.8% at most)


@pytest.mark.parametrize("name", QUANTIZED)
def test_the_matmul_computes_the_files_values_with_rows_independent(kernel, name):
    """Close to float32 arithmetic on the dequantized values (the 8-bit activations move results by well under 2%),
    and each row's bits the same whatever shares the call or how many threads run it."""
    rows, columns = 37, 512
    data = random_file(name, rows, columns, seed=1)
    matrix = BlockMatrix.from_file(name, data, rows, columns)
    generator = torch.Generator().manual_seed(2)
    x, bias = torch.randn(9, columns, generator=generator), torch.randn(rows, generator=generator)
    out = kernel.blocks(x, matrix, bias)
    expected = F.linear(x, reference(name, data, rows, columns), bias)
    assert (out - expected).norm() / expected.norm() < 0.02
    single = torch.cat([kernel.with_threads(1).blocks(x[i:i + 1], matrix, bias) for i in range(9)])
    for count in range(1, 10):
        assert torch.equal(kernel.blocks(x[:count], matrix, bias), single[:count]), f"{count} rows"
    assert torch.equal(kernel.with_threads(2).blocks(x, matrix, bias), single)


@pytest.mark.parametrize("name", QUANTIZED)
def test_the_matmul_is_llama_cpps_arithmetic(name):
    """The activations quantized as llama.cpp quantizes them for the type (8 bits per 32 with a float16 scale, or per
    256), then each block's terms: the result of that arithmetic within float rounding, inputs with a large mean
    (where Q4_1 / Q5_1's min terms dominate) included."""
    from tests.sources.test_gguf import block_mins, llama_cpp_matmul

    rows, columns = 64, 512
    generator = torch.Generator().manual_seed(8)
    weight = torch.randn(rows, columns, generator=generator) * 0.1
    data = np.ascontiguousarray(gguf_files.quantized(weight.numpy(), name))
    matrix = BlockMatrix.from_file(name, data, rows, columns)
    held = reference(name, data, rows, columns)
    mins = block_mins(weight, name) if name in ("q4_1", "q5_1") else None
    for x in (torch.randn(6, columns, generator=generator), torch.randn(6, columns, generator=generator) + 2.0):
        expected = llama_cpp_matmul(x, held, None, FORMATS[name].weights, mins)
        got = CpuKernel.load().blocks(x, matrix)
        assert ((got - expected).norm(dim=1) / expected.norm(dim=1)).max() < 2e-5


def test_every_path_gives_the_same_bits():
    """Integer dots and one fixed order of float steps: avx512 (or its emulation), avx2, neon (under qemu, in
    test_kernels_aarch64.py) and portable agree exactly, in every format, prompts of many rows included."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(19, 512, generator=generator)
    for name in QUANTIZED:
        matrix = BlockMatrix.from_file(name, random_file(name, 40, 512, seed=4), 40, 512)
        results = {path: kernel_for(path).blocks(x, matrix) for path in kernel_path_names()}
        first = next(iter(results.values()))
        assert all(torch.equal(first, other) for other in results.values()), (name, list(results))



def awkward_weights() -> torch.Tensor:
    """(40, 172) weights a quantizer must get right everywhere: heavy tails, a constant block, a zero block, values
    below float16's normal range, a last partial block."""
    generator = torch.Generator().manual_seed(14)
    weight = torch.randn(40, 172, generator=generator) * torch.exp(2 * torch.randn(40, 172, generator=generator))
    weight[0, :32] = 0.25
    weight[1, :32] = 0.0
    weight[2, :64] *= 1e-6
    return weight


@pytest.mark.parametrize("name", QUANTIZERS)
def test_every_path_quantizes_into_the_same_bytes(name):
    """edge's own quantizer (csrc/blocks_quantize.c, vectorized across blocks by the compiler) writes the same bytes
    on avx512, avx2 and portable (neon under qemu, in test_kernels_aarch64.py)."""
    weight = awkward_weights()
    files = {path: quantize_file(name, weight, kernel=kernel_for(path)) for path in kernel_path_names()}
    first = next(iter(files.values()))
    assert all(np.array_equal(first, other) for other in files.values()), list(files)

def test_segments_of_different_types_compute_as_separate_matrices(kernel):
    """A fused q/k/v whose v is Q6_K beside Q4_K q and k, or a 32-weight type beside a k-quant: each segment as if
    alone, stacked."""
    columns, generator = 512, torch.Generator().manual_seed(5)
    parts = [BlockMatrix.from_file(name, random_file(name, rows, columns, seed=rows), rows, columns)
             for name, rows in (("q4_k", 64), ("q4_k", 32), ("q6_k", 32), ("q8_0", 24))]
    fused = BlockMatrix.stack(parts)
    x, bias = torch.randn(5, columns, generator=generator), torch.randn(fused.rows, generator=generator)
    expected = torch.cat([kernel.blocks(x, part) for part in parts], dim=1) + bias
    assert torch.equal(kernel.blocks(x, fused, bias), expected)
    assert torch.equal(fused.dequantized(), torch.cat([part.dequantized() for part in parts]))
    assert torch.equal(fused.dequantized(60, 40), torch.cat([part.dequantized() for part in parts])[60:100])


def test_a_float_segment_beside_quantized_ones_runs_on_the_float_kernel(kernel):
    """A matrix a quantized file keeps in F16 (or F32, BF16): its rows as stored, exact float32 arithmetic on them,
    stacked with quantized segments."""
    columns, generator = 256, torch.Generator().manual_seed(11)
    halves = torch.randn(24, columns, generator=generator).half()
    quantized = BlockMatrix.from_file("q8_0", random_file("q8_0", 32, columns, seed=12), 32, columns)
    fused = BlockMatrix.stack([quantized, BlockMatrix.from_file("f16", halves.view(torch.uint8).numpy(), 24, columns)])
    x = torch.randn(3, columns, generator=generator)
    out = kernel.blocks(x, fused)
    assert torch.equal(out[:, :32], kernel.blocks(x, quantized))
    torch.testing.assert_close(out[:, 32:], F.linear(x, halves.float()), rtol=1e-5, atol=1e-5)
    assert torch.equal(fused.dequantized(30, 4)[2:], halves[:2].float())


def test_q8_0_codes_of_minus_128_are_exact_on_every_path():
    """A file may hold -128 (llama.cpp writes -127 at most); AVX2's sign trick would wrap it, so the kernel takes |w|
    instead."""
    data = random_file("q8_0", 16, 64, seed=6)
    data.reshape(16, 2, 34)[:, :, 2:] = np.uint8(0x80)  # every code -128
    matrix = BlockMatrix.from_file("q8_0", data, 16, 64)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7))
    expected = F.linear(x, reference("q8_0", data, 16, 64))
    for path in kernel_path_names():
        out = kernel_for(path).blocks(x, matrix)
        assert (out - expected).norm() / expected.norm() < 0.02, path


@pytest.mark.parametrize("name", ["q4_1", "q8_0"])
def test_a_width_that_is_not_whole_blocks_takes_zero_weights_past_it(kernel, name):
    """edge's own quantization of any shape (a 172-wide MLP): the last block padded with zero weights, the
    activations with zeros, the same result as the matrix padded by hand."""
    generator = torch.Generator().manual_seed(13)
    weight, x = torch.randn(40, 172, generator=generator), torch.randn(5, 172, generator=generator)
    matrix = BlockMatrix.quantized(name, weight)
    padded = BlockMatrix.quantized(name, torch.nn.functional.pad(weight, (0, 20)))
    assert torch.equal(matrix.dequantized(), padded.dequantized()[:, :172])
    assert torch.equal(kernel.blocks(x, matrix), kernel.blocks(torch.nn.functional.pad(x, (0, 20)), padded))


def test_a_file_tensor_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="takes 2304 bytes"):
        BlockMatrix.from_file("q4_k", np.zeros((16, 100), dtype=np.uint8), 16, 256)
