"""Reading an exported bundle (written by `edge-export`, see edge/export/bundle.py): check it, then open its graphs.

    bundle/
      manifest.json            format version, hashes and sizes of every file, settings, memory needs
      tokenizer.json ...       the tokenizer files (shared by target and drafter)
      target/model.onnx        the target graph (ONNX Runtime); target/config.json its Hugging Face config
      target/model.ts, .pt2    optional: TorchScript and torch.export programs of the same step
      drafter/...              optional: the draft model, the same way (trimmed head: drafter/vocab_map.json)

Every file the manifest lists is checked against its size and sha256 before anything is loaded, so a truncated or
edited bundle is refused with the name of the file rather than failing somewhere inside onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from edge.model.config import ModelConfig
from edge.errors import BundleError

FORMAT = "edge-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def is_bundle(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# backend name -> the manifest key of its file, in order of preference when none is asked for
BACKENDS = {"onnx": "onnx", "torchscript": "torchscript", "torch-export": "torch_export"}


@dataclass(frozen=True)
class Bundle:
    root: Path
    manifest: dict

    @property
    def has_drafter(self) -> bool:
        return self.manifest.get("drafter") is not None

    def backends(self, part: str = "target") -> list[str]:
        """The backends this bundle has files for (part: "target" or "drafter")."""
        return [name for name, key in BACKENDS.items() if self.manifest[part].get(key)]

    def pick_backend(self, requested: str | None) -> str:
        available = self.backends()
        if requested is None:
            return available[0]
        if requested not in available:
            raise BundleError(f"the bundle {self.root} has no {requested} target (it has: {', '.join(available)}); "
                              f"re-export with --format, or pick one of those")
        return requested

    def config(self, part: str = "target") -> ModelConfig:
        return ModelConfig.from_dir(self.root / self.manifest[part]["config_dir"])

    def drafter_vocab_map(self) -> torch.Tensor | None:
        """The full-vocabulary ids of the drafter's head rows (V',), or None for a full head."""
        name = self.manifest["drafter"].get("vocab_map")
        if name is None:
            return None
        ids = json.loads((self.root / name).read_text())["kept_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def open_model(self, part: str, backend: str, *, threads: int | None = None):
        """The exported `part` ("target" or "drafter") on `backend`, with the Transformer calls of exported models."""
        entry = self.manifest[part]
        path = self.root / entry[BACKENDS[backend]]
        # each backend's runtime (onnxruntime, torch.jit) is imported only when a bundle opens on it
        if entry.get("graph") == "optimum":  # an architecture edge's model file does not cover
            from edge.backends.optimum_backend import OptimumOnnxModel

            return OptimumOnnxModel(path, self.root / entry["config_dir"], threads=threads)
        vocab_map = self.drafter_vocab_map() if part == "drafter" else None
        if backend == "onnx":
            from edge.backends.onnx_backend import OnnxModel

            return OnnxModel(path, self.config(part), vocab_map=vocab_map, threads=threads)
        from edge.backends.torch_step_backend import TorchStepModel

        return TorchStepModel(path, self.config(part), vocab_map=vocab_map)


def read_bundle(path: str | Path, *, verify: bool = True) -> Bundle:
    """Parse and (by default) verify a bundle; raise BundleError naming what is wrong and how to fix it."""
    root = Path(path)
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise BundleError(f"{root} has no {MANIFEST}; it is not an edge bundle (make one with edge-export)") from None
    except (OSError, ValueError) as error:
        raise BundleError(f"{root / MANIFEST} is unreadable ({error}); re-export the bundle with edge-export") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{root / MANIFEST} is not an edge bundle manifest; re-export the bundle with edge-export")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BundleError(f"{root} is bundle format {version}, newer than this edge reads ({FORMAT_VERSION}); "
                          "upgrade edge, or re-export the bundle with this version's edge-export")
    bundle = Bundle(root, manifest)
    if verify:
        verify_files(bundle)
        verify_tokenizer(bundle)
    drafter = manifest.get("drafter")
    if drafter is not None and drafter.get("tokenizer_sha256") != manifest["tokenizer"]["sha256"]:
        raise BundleError(f"the drafter in {root} was exported with a different tokenizer than the target; a "
                          "drafter must share the target's tokenizer (re-export with a matching drafter)")
    return bundle


def verify_tokenizer(bundle: Bundle) -> None:
    """The tokenizer files read back to the vocabulary the manifest's `tokenizer.sha256` names (the vocabulary's
    fingerprint: what the model's ids mean)."""
    from edge.text.tokenizer import Tokenizer

    expected = (bundle.manifest.get("tokenizer") or {}).get("sha256")
    if not isinstance(expected, str):
        raise BundleError(f"{bundle.root / MANIFEST} has no tokenizer.sha256; re-export the bundle with edge-export")
    if Tokenizer.from_dir(bundle.root).fingerprint()["vocab_sha256"] != expected:
        raise BundleError(f"the tokenizer in {bundle.root} does not match the tokenizer.sha256 of its manifest "
                          "(replaced or modified); re-export the bundle")


def verify_files(bundle: Bundle) -> None:
    for name, expected in bundle.manifest.get("files", {}).items():
        path = bundle.root / name
        if not path.is_file():
            raise BundleError(f"bundle file {name} is missing from {bundle.root}; re-export the bundle")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise BundleError(f"bundle file {name} is {size} bytes, the manifest says {expected['bytes']} "
                              "(truncated or replaced); re-export the bundle")
        if sha256_file(path) != expected["sha256"]:
            raise BundleError(f"bundle file {name} does not match its sha256 in the manifest (modified or "
                              "corrupted); re-export the bundle")

