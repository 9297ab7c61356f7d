"""Which build of edge's CPU kernel runs here: one C source tree (csrc/), one library per CPU class.

    path = choose_path()              # EDGE_CPU_KERNEL if set, else the best path this CPU runs
    library = build(path)             # compiled on first use with the path's flags, cached

Paths, best first (simd.h says what each uses):

    avx512     x86-64-v4 (AVX-512 F/BW/DQ/VL), VNNI added where the CPU has it
    avx2       Haswell level: AVX2, FMA, F16C (Intel 4th generation on, AMD Zen)
    neon       aarch64 NEON, with the dot-product extension where the CPU has it (Raspberry Pi 5, Apple, Graviton)
    portable   the compiler's baseline (SSE2 on x86-64): any CPU

Set EDGE_CPU_KERNEL to one of these names to force a path, e.g. to test or benchmark the avx2 path on an AVX-512
machine; a path this CPU cannot run is an error naming the ones it can. The libraries live in
$EDGE_CACHE_DIR/kernels (default: the platform's user cache folder, ~/.cache/edge/kernels), named by a hash of the
sources, the compiler and the flags, so a changed source builds afresh.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from edge.kernels.cache import cache_folder

SOURCE_DIR = Path(__file__).with_name("csrc")
# -ffp-contract=off: no fused multiply-adds, so every path rounds the same steps the same way. -fno-trapping-math:
# nothing here reads floating-point exception flags, so the compiler may compute both sides of a select (and
# vectorize such loops) without changing a result.
COMMON_FLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fopenmp", "-fPIC", "-shared"]
LIBRARIES = ["-lm"]
ENVIRONMENT = "EDGE_CPU_KERNEL"


class KernelPathError(ValueError):
    """EDGE_CPU_KERNEL names a path that does not exist or that this CPU cannot run."""


@dataclass(frozen=True)
class CpuPath:
    name: str
    machine: str | None  # "x86_64", "aarch64", or None for any
    needs: frozenset[str]  # CPU feature flags (/proc/cpuinfo names) the path cannot run without
    flags: tuple[str, ...]
    extras: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (feature, flags that replace or extend `flags`)

    def runs_on(self, machine: str, features: set[str]) -> bool:
        return (self.machine is None or self.machine == machine) and self.needs <= features

    def build_flags(self, features: set[str]) -> list[str]:
        flags = list(self.flags)
        for feature, more in self.extras:
            if feature in features:
                if any(flag.startswith("-march=") for flag in more):  # a wider -march replaces the base one
                    flags = [flag for flag in flags if not flag.startswith("-march=")]
                flags += more
        return flags


PATHS = {
    "avx512": CpuPath("avx512", "x86_64", frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"}),
                      ("-march=x86-64-v4",), (("avx512_vnni", ("-mavx512vnni",)),)),
    "avx2": CpuPath("avx2", "x86_64", frozenset({"avx2", "fma", "f16c"}), ("-march=haswell",)),
    "neon": CpuPath("neon", "aarch64", frozenset({"asimd"}), ("-march=armv8-a",),
                    (("asimddp", ("-march=armv8.2-a+dotprod",)),)),
    "portable": CpuPath("portable", None, frozenset(), ()),
}


def machine() -> str:
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


@lru_cache(maxsize=1)
def cpu_features() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (/proc/cpuinfo "flags" on x86, "Features" on ARM)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    if machine() == "aarch64":  # every aarch64 CPU has NEON (macOS has no /proc/cpuinfo)
        return frozenset({"asimd"})
    return frozenset()


def runnable_paths() -> list[str]:
    """The paths this CPU can run, best first."""
    return [name for name, path in PATHS.items() if path.runs_on(machine(), set(cpu_features()))]


def choose_path() -> str:
    """EDGE_CPU_KERNEL when set (checked against this CPU), else the best path it runs."""
    forced = os.environ.get(ENVIRONMENT, "").strip().lower()
    runnable = runnable_paths()
    if not forced:
        return runnable[0]
    if forced not in PATHS:
        raise KernelPathError(f"{ENVIRONMENT}={forced} is not a CPU kernel path; use one of {', '.join(PATHS)} "
                              f"(this CPU runs {', '.join(runnable)}), or unset it")
    if forced not in runnable:
        missing = sorted(PATHS[forced].needs - cpu_features()) or [PATHS[forced].machine or "?"]
        raise KernelPathError(f"{ENVIRONMENT}={forced}: this CPU lacks {', '.join(missing)}; use one of "
                              f"{', '.join(runnable)}, or unset it")
    return forced


def sources() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.c"))


def compiler() -> str:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if found is None:
        raise OSError("no C compiler found (install gcc, or set CC)")
    return found


def build(path: str, extra_flags: list[str] | None = None, cc: str | None = None, output: Path | None = None,
          label: str | None = None) -> Path:
    """The library of `path` (its flags for this CPU, plus `extra_flags`), compiled by `cc` (default: the system
    compiler) into the cache under `label` (default: the path's name), or into `output` when given; a cached build
    is reused."""
    cc = cc or compiler()
    flags = [*COMMON_FLAGS, *PATHS[path].build_flags(set(cpu_features())), *(extra_flags or [])]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [p.read_text() for p in sorted(SOURCE_DIR.glob("*.[ch]"))]
    key = hashlib.sha256("\0".join([*texts, cc, version, " ".join(flags)]).encode()).hexdigest()[:16]
    library = output or cache_folder("kernels") / f"edge-kernel-{label or path}-{key}.so"
    if library.is_file() and output is None:
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix=".so", dir=library.parent)
    os.close(handle)
    try:
        result = subprocess.run([cc, *flags, *map(str, sources()), *LIBRARIES, "-o", temporary],
                                capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
            raise OSError(f"{cc} failed building the {path} kernel: {lines[0] if lines else 'no output'}")
        os.replace(temporary, library)  # atomic: concurrent builders never load a half-written library
    finally:
        Path(temporary).unlink(missing_ok=True)
    return library


