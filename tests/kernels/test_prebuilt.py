"""The CPU kernels are compiled when edge is installed (setup.py's build step over cpu_paths.prebuild) and found at
run time without a compiler; a build at run time, when one is still needed, says so with its progress."""

from __future__ import annotations

import importlib.util
import shutil
import stat
from pathlib import Path

import pytest
import torch
from setuptools.dist import Distribution

from edge.kernels import cpu_paths
from edge.kernels.cpu_kernel import CpuKernel

ROOT = Path(__file__).resolve().parents[2]
FILES = len(cpu_paths.sources())


def setup_module_file():
    """setup.py as a module (its setup() call runs only as a script)."""
    spec = importlib.util.spec_from_file_location("edge_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def quick_flags(monkeypatch):
    """-O0 instead of -O3: what is under test is where the libraries go and that they load, not their speed (an
    -O3 build of one path takes about 90 s of CPU)."""
    flags = ["-O0" if flag == "-O3" else flag for flag in cpu_paths.COMMON_FLAGS]
    monkeypatch.setattr(cpu_paths, "COMMON_FLAGS", flags)


@pytest.fixture
def fake_compiler(tmp_path, monkeypatch) -> Path:
    """A CC that answers --version and writes an empty file for each -o: a build's bookkeeping without its cost."""
    script = tmp_path / "fake-cc"
    script.write_text('#!/bin/sh\nout=""\nwhile [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
                      '[ -n "$out" ] && : > "$out"\necho "fake cc 1.0"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(script))
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_paths, "PREBUILT_DIR", tmp_path / "no-install")
    return script


def test_the_install_step_builds_libraries_the_loader_takes_without_a_compiler(tmp_path, monkeypatch, quick_flags):
    setup = setup_module_file()
    monkeypatch.setattr(setup, "cpu_paths", lambda: cpu_paths)
    monkeypatch.setenv(cpu_paths.BUILD_PATHS, "portable")
    command = setup.BuildKernels(Distribution())
    command.build_lib = str(tmp_path / "wheel")
    command.run()  # a regular install: into the wheel's package folder
    folder = tmp_path / "wheel" / "edge" / "kernels" / "prebuilt"
    libraries = sorted(folder.glob("edge-kernel-*.so"))
    assert [library.name.split("-")[2] for library in libraries] == ["portable"]
    assert command.get_outputs() == [str(libraries[0])]

    monkeypatch.setattr(cpu_paths, "PREBUILT_DIR", folder)  # where the installed package's loader looks first
    monkeypatch.setenv("CC", "/bin/false")  # any compile or `cc --version` now fails
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    assert cpu_paths.build("portable") == libraries[0]
    kernel = CpuKernel.open(libraries[0])
    assert kernel.path == "portable"
    x, weight = torch.randn(3, 64), torch.randn(16, 64)
    torch.testing.assert_close(kernel(x, weight), x @ weight.T, rtol=1e-4, atol=1e-4)
    assert not (tmp_path / "cache").exists()

    edited = tmp_path / "csrc"  # an edited source (an editable checkout): the install's library no longer matches
    shutil.copytree(cpu_paths.SOURCE_DIR, edited)
    (edited / "matmul.c").write_text((edited / "matmul.c").read_text() + "\n/* edited */\n")
    monkeypatch.setattr(cpu_paths, "SOURCE_DIR", edited)
    assert cpu_paths.prebuilt("portable") is None


def test_an_editable_install_builds_into_the_checkout(tmp_path, monkeypatch):
    setup = setup_module_file()
    monkeypatch.setattr(setup, "cpu_paths", lambda: cpu_paths)
    folders = []
    monkeypatch.setattr(cpu_paths, "prebuild", lambda folder, report: folders.append(folder) or [])
    command = setup.BuildKernels(Distribution())
    command.build_lib, command.editable_mode = str(tmp_path / "wheel"), True
    command.run()
    assert folders == [cpu_paths.PREBUILT_DIR] and cpu_paths.PREBUILT_DIR == ROOT / "edge" / "kernels" / "prebuilt"


def test_the_build_step_runs_in_every_install():
    """setuptools runs `build`'s sub-commands for a wheel and, each with editable_mode set, for `pip install -e`."""
    setup = setup_module_file()
    assert ("build_kernels", None) in setup.BuildWithKernels.sub_commands
    assert setup.BinaryDistribution().has_ext_modules()  # a platform wheel: it holds compiled code


def test_the_install_builds_every_path_of_this_machine_unless_told(monkeypatch):
    monkeypatch.delenv(cpu_paths.BUILD_PATHS, raising=False)
    paths = cpu_paths.buildable_paths()
    assert set(cpu_paths.runnable_paths()) <= set(paths) and "portable" in paths
    if cpu_paths.machine() == "x86_64":
        assert paths == ["avx512", "avx2", "portable"]  # avx512 too where this CPU lacks it
    monkeypatch.setenv(cpu_paths.BUILD_PATHS, "none")
    assert cpu_paths.buildable_paths() == []
    monkeypatch.setenv(cpu_paths.BUILD_PATHS, "avx2,sse9")
    with pytest.raises(cpu_paths.KernelPathError, match="sse9 is not a CPU kernel path"):
        cpu_paths.buildable_paths()


def test_a_build_at_run_time_says_so_with_its_progress(fake_compiler, capsys):
    library = cpu_paths.build("portable")
    err = capsys.readouterr().err
    assert "edge: building the CPU kernels for portable (one time, about " in err
    assert f"{FILES}/{FILES} files" in err and "edge: built the CPU kernels for portable in" in err
    assert library.is_file() and library.parent == fake_compiler.parent / "cache" / "kernels"
    assert cpu_paths.build("portable") == library  # cached: built once
    assert capsys.readouterr().err == ""


def test_the_next_estimate_is_the_last_build_time(fake_compiler, capsys):
    cpu_paths.record_timing("portable", 12.0, fake_compiler.parent / "cache" / "kernels")
    lines = []
    with cpu_paths.notices(lines.append):  # the chat app's loading screen takes them instead of stderr
        cpu_paths.build("portable")
    assert lines[0] == "edge: building the CPU kernels for portable (one time, about 12 s)..."
    assert len(lines) == FILES + 2 and capsys.readouterr().err == ""


def test_a_failed_compile_names_the_path_and_leaves_no_library(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_paths, "PREBUILT_DIR", tmp_path / "no-install")
    with pytest.raises(OSError, match="failed building the portable kernel"):
        cpu_paths.build("portable", extra_flags=["-DNOT_A_FLAG", "-fno-such-option"])
    assert not list((tmp_path / "cache" / "kernels").glob("*.so"))
