"""Reading an exported bundle (written by `edge-export`, see edge/export/bundle.py): check it, then open its graphs.

    bundle/
      manifest.json            format version, hashes and sizes of every file, settings, memory needs
      tokenizer.json ...       the tokenizer files (shared by target and drafter)
      target/model.onnx        the target graph (ONNX Runtime); target/config.json its Hugging Face config
      target/model.ts, .pt2    optional: TorchScript and torch.export programs of the same step
      drafter/...              optional: the draft model, the same way (trimmed head: drafter/vocab_map.json)

Every file the manifest lists is checked against its size and sha256 before anything is loaded, so a truncated or
edited bundle is refused with the name of the file rather than failing somewhere inside onnxruntime. The manifest
is covered too: it carries the sha256 of its own other fields (`manifest_sha256`), so an edited setting (a block
size) is refused, and what it records is checked against the files it describes (the weights file's size, the KV
cache's shape against target/config.json; the graph's inputs and outputs when a session opens).

A bundle is usable only once edge-export has validated it: the manifest's `validation` record is written last, in
the same rename that puts the bundle in place. The folder an export works in (`.NAME.partial-*` beside the output,
left behind only when the export was killed) is refused by name, and the next export of NAME removes it.
"""

from __future__ import annotations

import hashlib
import json
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from edge.model.config import ModelConfig
from edge.errors import BundleError
from edge.files import read_regular

FORMAT = "edge-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest is a few KiB; its drafter's vocabulary map is a file of its own
SEAL = "manifest_sha256"  # the manifest's own hash: the sha256 of its other fields (manifest_digest)
# the folders edge-export works in beside its output NAME: .NAME.partial-XXXX (mkdtemp), .NAME.replaced-PID (an old
# bundle renamed aside during --overwrite)
UNFINISHED = re.compile(r"\.(?P<name>.+)\.(?P<kind>partial|replaced)-[^/]*")
_validating: ContextVar[Path | None] = ContextVar("validating_bundle", default=None)
# what an export folder holds before its manifest is written: a graph or program of the target
GRAPH_FILES = ("target/model.onnx", "target/model.ts", "target/model.pt2")


def is_bundle(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


@contextmanager
def validating(root: str | Path) -> Iterator[None]:
    """Inside, the unfinished export folder `root` loads as a bundle: edge-export validating its own output before
    it moves it into place (the one place such a folder is read)."""
    token = _validating.set(Path(root).resolve())
    try:
        yield
    finally:
        _validating.reset(token)


def refuse_unfinished(path: str | Path) -> None:
    """A BundleError for a folder an export left unfinished (named .NAME.partial-*, or an old bundle set aside), and
    for a bundle folder whose manifest is missing; nothing for anything else."""
    root = Path(path)
    match = UNFINISHED.fullmatch(root.name)
    if match is not None and match["kind"] == "replaced":
        raise BundleError(f"{root} is an old bundle edge-export set aside while replacing "
                          f"{root.parent / match['name']} (the export was killed then), which is never loaded; load "
                          f"{root.parent / match['name']}, and delete this folder")
    if match is not None and _validating.get() != root.resolve():
        raise BundleError(f"{root} is an unfinished edge-export (the export was stopped before it validated the "
                          f"bundle), which is never loaded; export again to {root.parent / match['name']} (that "
                          "removes this folder), or delete it")
    if not is_bundle(root) and any((root / name).is_file() for name in GRAPH_FILES):
        graph = next(name for name in GRAPH_FILES if (root / name).is_file())
        raise BundleError(f"{root} holds an exported graph ({graph}) but no {MANIFEST}, which lists and checks "
                          "the bundle's files; it was damaged or only partly copied: export it again with "
                          "edge-export (or copy the whole bundle folder)")


def manifest_digest(manifest: dict) -> str:
    """The sha256 of the manifest's fields other than its seal, as canonical JSON (sorted keys, no spaces)."""
    body = {key: value for key, value in manifest.items() if key != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode("utf-8")).hexdigest()


def sealed(manifest: dict) -> dict:
    """`manifest` with its seal: what edge-export writes, so that an edit to any field is refused on load."""
    return {**manifest, SEAL: manifest_digest(manifest)}


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
    """Parse and (by default) verify a bundle; raise BundleError naming what is wrong and how to fix it. The
    manifest's seal, its validation record and an unfinished export's folder name are checked either way."""
    root = Path(path)
    refuse_unfinished(root)
    try:
        manifest = json.loads(read_regular(root / MANIFEST, MAX_MANIFEST_BYTES))
    except FileNotFoundError:
        raise BundleError(f"{root} has no {MANIFEST}; it is not an edge bundle (make one with edge-export)") from None
    except RecursionError:
        raise BundleError(f"{root / MANIFEST} is nested too deeply to be a manifest; re-export the bundle with "
                          "edge-export") from None
    except (OSError, ValueError) as error:
        raise BundleError(f"{root / MANIFEST} is unreadable ({error}); re-export the bundle with edge-export") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{root / MANIFEST} is not an edge bundle manifest; re-export the bundle with edge-export")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BundleError(f"{root} is bundle format {version}, newer than this edge reads ({FORMAT_VERSION}); "
                          "upgrade edge, or re-export the bundle with this version's edge-export")
    verify_seal(root, manifest)
    bundle = Bundle(root, manifest)
    if verify:
        verify_files(bundle)
        verify_consistency(bundle)
        verify_tokenizer(bundle)
    drafter = manifest.get("drafter")
    if drafter is not None and drafter.get("tokenizer_sha256") != manifest["tokenizer"]["sha256"]:
        raise BundleError(f"the drafter in {root} was exported with a different tokenizer than the target; a "
                          "drafter must share the target's tokenizer (re-export with a matching drafter)")
    return bundle


def kv_per_token(config: ModelConfig) -> int:
    """Bytes of keys and values per position for a float32 cache (what the exported backends allocate)."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4


def verify_seal(root: Path, manifest: dict) -> None:
    """The manifest holds its seal, the seal matches its fields, and the export recorded its validation (written
    last: a manifest without it is from an export that did not finish)."""
    fix = "re-export the bundle with edge-export"
    if SEAL not in manifest:
        raise BundleError(f"{root / MANIFEST} has no {SEAL} (written by an older edge-export, or edited); {fix}")
    if manifest[SEAL] != manifest_digest(manifest):
        raise BundleError(f"{root / MANIFEST} does not match its {SEAL} (a setting in it was edited, or the file is "
                          f"corrupted); {fix}")
    if "validation" not in manifest and _validating.get() != root.resolve():
        raise BundleError(f"{root / MANIFEST} has no validation record: the export did not finish; {fix}")


def verify_consistency(bundle: Bundle) -> None:
    """What the manifest records agrees with the files it describes: its weight settings are ones edge-export
    writes, the weights file has the size its memory figures count, and the KV cache it sizes has the shape of
    target/config.json's layers (a graph edge built)."""
    manifest, root = bundle.manifest, bundle.root
    fix = "re-export the bundle with edge-export"
    quantization = manifest.get("quantization") or {}
    weights, block = quantization.get("weights"), quantization.get("block_size")
    if weights in ("int8", "int4") and not (isinstance(block, int) and block >= 16 and not block & (block - 1)):
        raise BundleError(f"{root / MANIFEST} gives a block size of {block!r} for its {weights} weights, which "
                          f"edge-export never writes (a power of two, at least 16); {fix}")
    memory, target = manifest.get("memory"), manifest.get("target") or {}
    weights_file = target.get("onnx") or target.get("torchscript")
    if memory and weights_file in manifest.get("files", {}):
        recorded, actual = memory.get("target_weights_bytes"), manifest["files"][weights_file]["bytes"]
        if recorded != actual:
            raise BundleError(f"{root / MANIFEST} counts {recorded} bytes of target weights but {weights_file} is "
                              f"{actual} bytes; {fix}")
    if memory and target.get("graph") != "optimum" and "target_kv_bytes_per_token" in memory:
        config = bundle.config("target")
        expected = kv_per_token(config)
        if memory["target_kv_bytes_per_token"] != expected:
            raise BundleError(f"{root / MANIFEST} sizes the KV cache at {memory['target_kv_bytes_per_token']} bytes "
                              f"per token, but target/config.json's {config.num_layers} layers of "
                              f"{config.num_kv_heads} x {config.head_dim} need {expected}; {fix}")


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

