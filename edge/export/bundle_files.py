"""What both exporters (edge/export/bundle.py's own graphs, edge/export/optimum_export.py's) write the same way: the files a
bundle copies from its checkpoint, the manifest's head and file table, and the logits tolerance per weight format."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import edge
from edge.backends.bundle import FORMAT, FORMAT_VERSION, MANIFEST, kv_per_token, sealed, sha256_file
from edge.text.tokenizer import Tokenizer

TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "int8": 6e-2, "int4": 0.3}  # max relative logits error per format
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt")
CONFIG_FILES = ("config.json", "generation_config.json")


def manifest_head(checkpoint: Path, tokenizer, options) -> dict:
    """The manifest's fields every bundle has: format, provenance, tokenizer fingerprint and quantization
    (`options`: edge.export.bundle.ExportOptions)."""
    fingerprint = tokenizer.fingerprint()
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_by": f"edge-export {edge.__version__}",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": {"path": str(checkpoint.resolve()),
                   "files": {p.name: sha256_file(p) for p in sorted(checkpoint.iterdir()) if p.is_file()}},
        "tokenizer": {"sha256": fingerprint["vocab_sha256"], "chat_template_sha256": fingerprint["chat_template_sha256"]},
        "quantization": options.quant.describe(),
        "row_invariant": options.quant.row_invariant,
        "backend": "onnxruntime",
    }


def write_chat_template(root: Path, manifest: dict, tokenizer, options) -> None:
    """The bundle's chat template: --chat-template's (`options.chat_template`) written as chat_template.jinja, which
    the runtime's tokenizer reads before tokenizer_config.json's entry, or the checkpoint's own (already copied);
    recorded in the manifest. Without either the bundle is a completion model (`manifest["completion_model"]`)."""
    if options.chat_template is not None:
        (root / "chat_template.jinja").write_text(options.chat_template, encoding="utf-8")
        source, origin = options.chat_template, options.chat_template_origin or "given"
    elif tokenizer.chat_template is not None:
        source, origin = tokenizer.chat_template.source, "checkpoint"
    else:
        source, origin = None, None
    manifest["chat_template"] = None if source is None else {
        "from": origin, "sha256": hashlib.sha256(source.encode("utf-8")).hexdigest()}
    manifest["completion_model"] = source is None
    if options.chat_template is not None:  # the fingerprint of the templates the bundle's tokenizer holds
        fingerprint = Tokenizer.from_dir(root).fingerprint()
        manifest["tokenizer"]["chat_template_sha256"] = fingerprint["chat_template_sha256"]


def copy_files(source: Path, destination: Path, names: tuple[str, ...]) -> None:
    for name in names:
        if (source / name).is_file():
            shutil.copyfile(source / name, destination / name)


def file_table(root: Path) -> dict:
    return {str(path.relative_to(root)): {"sha256": sha256_file(path), "bytes": path.stat().st_size}
            for path in sorted(root.rglob("*")) if path.is_file() and path.name != MANIFEST}


def write_manifest(root: Path, manifest: dict) -> dict:
    """The manifest, sealed (edge.backends.bundle.sealed: its own sha256 over its fields), written in one rename;
    returns what was written."""
    path, manifest = root / MANIFEST, sealed(manifest)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(manifest, indent=1))
    os.replace(temporary, path)
    return manifest
