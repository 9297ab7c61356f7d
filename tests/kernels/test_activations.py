"""The element-wise activations of the fused calls (csrc/simd.h: SwiGLU's silu, GeGLU's gelu-tanh, capped logits) on
every CPU path: a small program (tests/kernels/csrc/activations.c) built with each path's flags, natively, with the
avx512 code emulated and for aarch64 under qemu-user. Each is close to torch, gives an element the same bits whatever
span it is computed in, and the paths with a fused multiply-add (all but portable, which multiplies then adds) give
the same bits as each other."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from edge.kernels import cpu_paths
from edge.kernels.cpu_kernel import CpuKernel
from tests.conftest import kernel_path_names
from tests.kernels.test_kernels_aarch64 import CROSS, FLAGS, QEMU, SYSROOT, missing

pytestmark = pytest.mark.skipif(CpuKernel.load() is None, reason="no C compiler: the kernel falls back to torch")
PROGRAM = Path(__file__).parent / "csrc" / "activations.c"
COUNT = 203  # no lane count's multiple: every path's zero-padded tail
AARCH64 = [] if missing else list(FLAGS)


def build(path: str, folder: Path) -> list[str]:
    """The command that runs the program built for `path` (a native path, "avx512-emulated", or an aarch64 one)."""
    flags = [flag for flag in cpu_paths.COMMON_FLAGS if flag not in ("-fPIC", "-shared")]
    if path in FLAGS:
        compiler, flags, runner = CROSS, [*flags, FLAGS[path]], [QEMU, "-L", SYSROOT]
    elif path == "avx512-emulated":
        compiler, flags, runner = cpu_paths.compiler(), [*flags, "-march=haswell", "-DEDGE_EMULATE_AVX512",
                                                         "-Wno-psabi"], []
    else:
        compiler, runner = cpu_paths.compiler(), []
        flags += cpu_paths.PATHS[path].build_flags(set(cpu_paths.cpu_features()))
    program = folder / f"activations-{path}"
    subprocess.run([compiler, *flags, f"-I{cpu_paths.SOURCE_DIR}", str(PROGRAM), "-o", str(program), "-lm"],
                   check=True, timeout=300)
    return [*runner, str(program)]


def test_the_activations_agree_on_every_path(tmp_path):
    generator = torch.Generator().manual_seed(0)
    gate = torch.cat([torch.linspace(-12, 12, 150), 3 * torch.randn(COUNT - 150, generator=generator)])  # (COUNT,)
    up = torch.randn(COUNT, generator=generator)
    wide = gate.double()
    expected = torch.stack([F.silu(wide) * up, F.gelu(wide, approximate="tanh") * up, 30 * torch.tanh(wide / 30)])
    results = {}
    for path in kernel_path_names() + AARCH64:
        run = subprocess.run([*build(path, tmp_path), str(COUNT)], input=gate.numpy().tobytes() + up.numpy().tobytes(),
                             capture_output=True, timeout=120)
        assert run.returncode == 0, run.stderr.decode()
        whole, spans = torch.frombuffer(bytearray(run.stdout), dtype=torch.float32).view(2, 3, COUNT)
        assert torch.equal(whole, spans), path
        for name, got, want, tolerance in zip(("silu", "gelu", "softcap"), whole, expected, (2e-6, 2e-6, 1e-5)):
            assert (got.double() - want).abs().max().item() < tolerance, (path, name)
        results[path] = whole
    fused = [path for path in results if path != "portable"]
    assert len(fused) >= 1 and all(torch.equal(results[path], results[fused[0]]) for path in fused), fused
