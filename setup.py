"""The install's one build step beyond pyproject.toml: compile edge's CPU kernels (edge/kernels/csrc) for every path
this machine's compiler builds, so that nothing compiles on first use (edge/kernels/cpu_paths.py chooses the path
for the running CPU). `pip install .` puts the libraries into the wheel, `pip install -e .` into the checkout's
edge/kernels/prebuilt/. EDGE_BUILD_PATHS=avx2,portable builds only those, EDGE_BUILD_PATHS=none none."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


def cpu_paths():
    """edge/kernels/cpu_paths.py loaded on its own: the build runs before edge's dependencies are installed."""
    spec = importlib.util.spec_from_file_location("edge_build_cpu_paths", ROOT / "edge" / "kernels" / "cpu_paths.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


class BuildKernels(Command):
    description = "compile edge's CPU kernels for every path this machine's compiler builds"
    user_options = [("build-lib=", "b", "the folder the package is built into")]

    def initialize_options(self) -> None:
        self.build_lib = None
        self.editable_mode = False  # set by setuptools for `pip install -e`: the libraries go into the checkout
        self.outputs: list[str] = []

    def finalize_options(self) -> None:
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def run(self) -> None:
        paths = cpu_paths()
        folder = paths.PREBUILT_DIR if self.editable_mode else Path(self.build_lib, "edge", "kernels", "prebuilt")
        built = paths.prebuild(folder, report=lambda line: print(line, file=sys.stderr, flush=True))
        self.outputs = [str(library) for library in built]

    def get_outputs(self) -> list[str]:
        return self.outputs

    def get_output_mapping(self) -> dict[str, str]:
        return {}

    def get_source_files(self) -> list[str]:
        return [str(path.relative_to(ROOT)) for path in sorted((ROOT / "edge" / "kernels" / "csrc").iterdir())]


class BuildWithKernels(build):
    sub_commands = [*build.sub_commands, ("build_kernels", None)]


class BinaryDistribution(Distribution):
    """The wheel holds compiled libraries: tagged for this platform, not as pure Python."""

    def has_ext_modules(self) -> bool:
        return True


if __name__ == "__main__":
    setup(cmdclass={"build": BuildWithKernels, "build_kernels": BuildKernels}, distclass=BinaryDistribution)
