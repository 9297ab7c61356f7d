"""What an install of edge puts into a user's environment: one import root, `edge`, and nothing of the checkout's
developer tools (bench/, train/); and edge beside Hugging Face's `kernels` package (which transformers imports when
it is installed), both importable and both working in one process."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BOTH_IN_ONE_PROCESS = """
import torch
import kernels
from kernels import Mode, kernelize, use_kernel_forward_from_hub

import edge.kernels.cpu_paths
from edge import Engine
from edge.sources.builtin import BUILTIN_DIR

assert "site-packages" in kernels.__file__, kernels.__file__  # Hugging Face's, not a folder of this checkout
assert Path(edge.kernels.cpu_paths.__file__).is_relative_to(Path("{root}") / "edge"), edge.kernels.cpu_paths.__file__


@use_kernel_forward_from_hub("RMSNorm")
class RMSNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((8,), 2.0))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # no hub kernel is mapped for this layer here: the original forward stays
    layer = kernelize(torch.nn.Sequential(RMSNorm()), mode=Mode.INFERENCE, device="cpu")
assert torch.allclose(layer(torch.ones(2, 8)), torch.full((2, 8), 2.0))

engine = Engine.load(BUILTIN_DIR)
prompt = engine.tokenizer.encode("What does os.path.join do?", add_special_tokens=True)
engine.complete(prompt, max_new_tokens=4)
assert len(engine.history) > len(prompt), engine.history
print("both work")
"""


def test_hugging_faces_kernels_package_and_edge_work_side_by_side():
    """Run from the checkout's root, where `python -m` puts the folder first on sys.path: `kernels` must still be
    Hugging Face's package (edge's CPU kernel is edge.kernels), and both must work in one process."""
    script = "from pathlib import Path\n" + BOTH_IN_ONE_PROCESS.format(root=ROOT)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "both work" in done.stdout


def checkout_copy(destination: Path) -> Path:
    """The checkout's tracked files (as a fresh clone has them) copied to `destination`."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        source, target = ROOT / name, destination / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return destination


@pytest.mark.slow
def test_an_install_owns_only_the_edge_import_root(tmp_path):
    """Build the wheel from a copy of the checkout, install it into an empty environment and list what it put there
    (`pip show -f edge`): `edge` alone at the top of site-packages, its C sources and stylesheet inside, no bench/
    or train/. The kernels are left uncompiled here (EDGE_BUILD_PATHS=none; tests/kernels/test_prebuilt.py builds
    them with the install's step)."""
    source = checkout_copy(tmp_path / "checkout")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheels"),
                    str(source)], check=True, capture_output=True, timeout=600,
                   env={**os.environ, "EDGE_BUILD_PATHS": "none"})
    wheel = next((tmp_path / "wheels").glob("edge-*.whl"))
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"  # edge-0.1.0: a platform wheel (compiled code)
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"edge", dist_info}
    assert "edge/kernels/csrc/layers.c" in names and "edge/tui/edge_chat.tcss" in names

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True, timeout=120)
    target = tmp_path / "env" / "bin" / "python"
    subprocess.run([*pip, "--python", str(target), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    shown = subprocess.run([*pip, "--python", str(target), "show", "-f", "edge"], check=True, capture_output=True,
                           text=True, timeout=120).stdout
    files = [line.strip() for line in shown.split("Files:", 1)[1].splitlines() if line.strip()]
    tops = {file.split("/")[0] for file in files if not file.startswith("../")}  # ../bin: the console scripts
    assert tops == {"edge", dist_info}, tops
    assert not [file for file in files if file.startswith(("bench/", "train/"))]
    scripts = {Path(file).name for file in files if file.startswith("../")}
    assert {"edge-chat", "edge-serve", "edge-export", "edge-bench"} <= scripts
