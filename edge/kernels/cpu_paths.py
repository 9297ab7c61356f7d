"""Which build of edge's CPU kernel runs here: one C source tree (csrc/), one library per CPU class.

    path = choose_path()              # EDGE_CPU_KERNEL if set, else the best path this CPU runs
    library = build(path)             # the install's library for the path, else compiled once and cached

Paths, best first (simd.h says what each uses):

    avx512     x86-64-v4 (AVX-512 F/BW/DQ/VL), VNNI added where the CPU has it
    avx2       Haswell level: AVX2, FMA, F16C (Intel 4th generation on, AMD Zen)
    neon       aarch64 NEON, with the dot-product extension where the CPU has it (Raspberry Pi 5, Apple, Graviton)
    portable   the compiler's baseline (SSE2 on x86-64): any CPU

Set EDGE_CPU_KERNEL to one of these names to force a path, e.g. to test or benchmark the avx2 path on an AVX-512
machine; a path this CPU cannot run is an error naming the ones it can.

`pip install` compiles every path this machine's compiler builds (`prebuild`, run by setup.py's build step) into
prebuilt/ beside this file, each library named by a hash of the sources and its flags; `build` loads that one when
the hash still matches. Otherwise (a source edited in an editable checkout, a path the install did not build) it
compiles at run time, saying so on stderr with its progress, into $EDGE_CACHE_DIR/kernels (default: the platform's
user cache folder, ~/.cache/edge/kernels), named by a hash of the sources, the compiler and the flags. This module
imports nothing of edge at the top, so setup.py loads it alone, before edge's dependencies are installed.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

SOURCE_DIR = Path(__file__).with_name("csrc")
PREBUILT_DIR = Path(__file__).with_name("prebuilt")  # the install's libraries, found before any cache or compiler
# -ffp-contract=off: no fused multiply-adds, so every path rounds the same steps the same way. -fno-trapping-math:
# nothing here reads floating-point exception flags, so the compiler may compute both sides of a select (and
# vectorize such loops) without changing a result.
COMMON_FLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fopenmp", "-fPIC", "-shared"]
LIBRARIES = ["-lm"]
ENVIRONMENT = "EDGE_CPU_KERNEL"
BUILD_PATHS = "EDGE_BUILD_PATHS"  # what the install compiles: path names, comma-separated, or "none"
TIMINGS = "build-seconds.json"  # each library's last build time, for the next build's estimate
DEFAULT_ESTIMATE_S = 40  # one path's build on 2 busy cores, before this machine has timed one


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


def path_flags(path: str, extra_flags: list[str] | None = None) -> list[str]:
    """The compiler flags of one path on this CPU, plus `extra_flags`."""
    return [*COMMON_FLAGS, *PATHS[path].build_flags(set(cpu_features())), *(extra_flags or [])]


def source_key(*parts: str) -> str:
    """A hash of the C sources and headers with `parts` (flags, the compiler): a library's name changes with any."""
    texts = [p.read_text() for p in sorted(SOURCE_DIR.glob("*.[ch]"))]
    return hashlib.sha256("\0".join([*texts, *parts]).encode()).hexdigest()[:16]


def library_name(label: str, key: str) -> str:
    return f"edge-kernel-{label}-{key}.so"


def prebuilt(path: str, extra_flags: list[str] | None = None, label: str | None = None,
             folder: Path | None = None) -> Path | None:
    """The install's library of `path` with these flags (`folder`: default PREBUILT_DIR), or None where the
    install built none or the sources or flags changed since."""
    flags = path_flags(path, extra_flags)
    library = (folder or PREBUILT_DIR) / library_name(label or path, source_key(" ".join(flags)))
    return library if library.is_file() else None


def build(path: str, extra_flags: list[str] | None = None, cc: str | None = None, output: Path | None = None,
          label: str | None = None) -> Path:
    """The library of `path` (its flags for this CPU, plus `extra_flags`): the install's (PREBUILT_DIR) when its
    sources and flags match, else compiled by `cc` (default: the system compiler) into the cache under `label`
    (default: the path's name), or into `output` when given; a cached build is reused. A compile says so on stderr,
    with its progress (`notices` redirects that)."""
    if cc is None and output is None:
        installed = prebuilt(path, extra_flags, label)
        if installed is not None:
            return installed
    from edge.kernels.cache import cache_folder  # here: setup.py loads this module without edge's dependencies

    cc = cc or compiler()
    flags = path_flags(path, extra_flags)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    folder = cache_folder("kernels")
    library = output or folder / library_name(label or path, source_key(cc, version, " ".join(flags)))
    if library.is_file() and output is None:
        return library
    name = label or path
    estimate = timing(name, folder) or timing(name, PREBUILT_DIR) or DEFAULT_ESTIMATE_S
    notice = _notice.get()
    notice(f"edge: building the CPU kernels for {name} (one time, about {estimate:.0f} s)...")
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        notice(f"edge: building the CPU kernels for {name}: {done}/{total} files, {time.monotonic() - started:.0f} s")

    failures = compile_libraries(cc, [(name, flags, library)], progress)
    if failures:
        raise OSError(failures[name])
    seconds = time.monotonic() - started
    notice(f"edge: built the CPU kernels for {name} in {seconds:.0f} s")
    record_timing(name, seconds, folder)
    return library


def _stderr_notice(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_notice: contextvars.ContextVar[Callable[[str], None]] = contextvars.ContextVar("kernel_build_notice",
                                                                               default=_stderr_notice)


@contextlib.contextmanager
def notices(sink: Callable[[str], None]) -> Iterator[None]:
    """Send a run-time build's notice and progress lines to `sink` instead of stderr (the chat app's loading
    screen) while the block runs, in this thread."""
    token = _notice.set(sink)
    try:
        yield
    finally:
        _notice.reset(token)


def compile_libraries(cc: str, targets: list[tuple[str, list[str], Path]],
                      progress: Callable[[int, int], None] | None = None) -> dict[str, str]:
    """Compile each (name, flags, library) target's sources into its library, every source file of every target
    on its own core, then link each; `progress(done, total)` after each file. The errors by target name (one line
    each; a failed target leaves no file): empty when all built. A library appears whole or not at all."""
    objects = Path(tempfile.mkdtemp(prefix="edge-kernel-objects-"))
    jobs = [(name, [flag for flag in flags if flag != "-shared"], source, objects / f"{name}-{source.stem}.o")
            for name, flags, _ in targets for source in sources()]
    failures: dict[str, str] = {}
    done = 0

    def compile_one(job):
        name, flags, source, target = job
        return name, subprocess.run([cc, *flags, "-c", str(source), "-o", str(target)], capture_output=True,
                                    text=True, timeout=600)

    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for name, result in pool.map(compile_one, jobs):
                done += 1
                if result.returncode != 0 and name not in failures:
                    failures[name] = _first_error(cc, name, result.stderr)
                if progress is not None:
                    progress(done, len(jobs))
        for name, flags, library in targets:
            if name not in failures:
                error = _link(cc, flags, [job[3] for job in jobs if job[0] == name], library)
                if error:
                    failures[name] = _first_error(cc, name, error)
    finally:
        shutil.rmtree(objects, ignore_errors=True)
    return failures


def _link(cc: str, flags: list[str], objects: list[Path], library: Path) -> str | None:
    """Link `objects` into `library` (atomically: concurrent builders never load a half-written one); the
    compiler's error output on failure."""
    library.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix=".so", dir=library.parent)
    os.close(handle)
    try:
        result = subprocess.run([cc, *flags, *map(str, objects), *LIBRARIES, "-o", temporary],
                                capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            return result.stderr or "no output"
        os.replace(temporary, library)
        return None
    finally:
        Path(temporary).unlink(missing_ok=True)


def _first_error(cc: str, name: str, stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "error" in line] or stderr.splitlines()
    return f"{cc} failed building the {name} kernel: {lines[0] if lines else 'no output'}"


def timing(name: str, folder: Path) -> float | None:
    """The last build time of library `name` recorded in `folder`, or None."""
    try:
        return float(json.loads((folder / TIMINGS).read_text())[name])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_timing(name: str, seconds: float, folder: Path) -> None:
    path = folder / TIMINGS
    try:
        folder.mkdir(parents=True, exist_ok=True)
        times = json.loads(path.read_text()) if path.is_file() else {}
        times[name] = round(seconds, 1)
        path.write_text(json.dumps(times, indent=1))
    except (OSError, ValueError):
        pass  # only the next estimate is lost


def buildable_paths() -> list[str]:
    """Every path of this machine's architecture, whether or not this CPU runs it (a library built here may run
    on another machine): what the install compiles, unless EDGE_BUILD_PATHS names others or "none"."""
    named = os.environ.get(BUILD_PATHS, "").strip().lower()
    if named == "none":
        return []
    if named:
        unknown = [name for name in named.split(",") if name.strip() not in PATHS]
        if unknown:
            raise KernelPathError(f"{BUILD_PATHS}={named}: {', '.join(unknown)} is not a CPU kernel path; use "
                                  f"some of {', '.join(PATHS)}, or none")
        return [name.strip() for name in named.split(",")]
    return [name for name, path in PATHS.items() if path.machine in (None, machine())]


def prebuild(folder: Path = PREBUILT_DIR, paths: list[str] | None = None,
             report: Callable[[str], None] = _stderr_notice) -> list[Path]:
    """Compile `paths` (default: buildable_paths()) into `folder`, where `prebuilt` finds them, replacing the
    libraries an earlier install left there; a path the compiler rejects is reported and left out (it compiles at
    run time if it is ever needed). The libraries built."""
    paths = buildable_paths() if paths is None else paths
    if not paths:
        return []
    try:
        cc = compiler()
    except OSError as error:
        report(f"edge: not building the CPU kernels at install: {error}; they compile on first use")
        return []
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(library_name("*", "*")):
        old.unlink()
    targets = [(name, path_flags(name), folder / library_name(name, source_key(" ".join(path_flags(name)))))
               for name in paths]
    report(f"edge: building the CPU kernels for {', '.join(paths)}...")
    started = time.monotonic()
    failures = compile_libraries(cc, targets)
    seconds = time.monotonic() - started
    for name, error in failures.items():
        report(f"edge: leaving out the {name} kernel ({error})")
    built = [library for name, _, library in targets if name not in failures]
    for name, _, _ in targets:
        if name not in failures:
            record_timing(name, seconds / len(targets), folder)  # one path's share: a run-time build compiles one
    report(f"edge: built the CPU kernels for {', '.join(n for n, _, _ in targets if n not in failures)} "
           f"in {seconds:.0f} s")
    return built
