"""Downloading catalogue models (and named Hub files) into the Hugging Face cache, checked by sha256, and removing them.

    pull("qwen2.5-coder-1.5b")     # the file, then its draft's; each checked against its sha256
    pull("Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf")   # any Hub file, checked the same way
    remove("qwen2.5-coder-1.5b")   # its file out of the cache

Downloads go through huggingface_hub's hf_hub_download into its cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub) with its progress bar; a download that was killed resumes from its .incomplete file the
next time. After a download the file's sha256 is computed and compared with the catalogue's (or, where the
catalogue records none, with the sha256 the Hub reports for the file); a file that differs is removed from the cache,
so the next pull downloads it again, and the error says so in one line. $HF_ENDPOINT is read at each call (a mirror,
or the tests' local server), not once at import as huggingface_hub reads it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edge.errors import CheckpointError
from edge.sources.catalogue import Entry, is_sha256, load_catalogue, local_file, lookup, pulled_file
from edge.sources.model_source import HubName, hub_cache_dir, hub_call

Report = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"edge: {message}", file=sys.stderr, flush=True)


def hub_endpoint() -> str | None:
    """$HF_ENDPOINT as set now, or None (huggingface_hub's default, huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def entry_for(name: str) -> Entry:
    """The catalogue entry `name` names, or an unnamed entry for a Hub file (org/repo/file.gguf, optionally
    org/repo@revision/file.gguf); anything else is one line listing what `edge pull` takes."""
    entry = lookup(name)
    if entry is not None:
        return entry
    hub = HubName.parse(name)
    if hub is not None and hub.file is not None:
        return Entry(name=name, repo=hub.repo, file=hub.file, revision=hub.revision)
    known = ", ".join(sorted(load_catalogue()))
    raise CheckpointError(f"{name!r} is not in edge's catalogue ({known}) and not a Hub file "
                          "(org/repo/file.gguf); run `edge list` to see the catalogue")


def pull(name: str, *, draft: bool = True, progress: bool = True, report: Report | None = _stderr) -> list[Path]:
    """Download `name` (a catalogue name or a Hub file) and, with `draft`, its catalogue draft; the files' paths in
    the cache, each checked by sha256."""
    entry = entry_for(name)
    entries = [entry] + ([lookup(entry.draft)] if draft and entry.draft else [])
    paths = []
    for each in entries:
        if report and each is not entry:
            report(f"{entry.name} drafts with {each.name}: pulling it too (--no-draft skips it)")
        paths.append(download(each, progress=progress, report=report))
    return paths


def download(entry: Entry, *, progress: bool = True, report: Report | None = None) -> Path:
    """One entry's file into the cache (resuming a partial download), checked against its sha256."""
    from huggingface_hub import hf_hub_download

    cache, endpoint = hub_cache_dir(), hub_endpoint()
    with hub_call(lambda error: _download_problem(entry, error), progress):
        expected = entry.sha256 or _hub_sha256(entry, endpoint)
        if report:
            size = f", {human_size(entry.size)}" if entry.size else ""
            report(f"pulling {entry.file} from {entry.repo}{size} into {cache}")
        path = Path(hf_hub_download(entry.repo, entry.file, revision=entry.revision, cache_dir=cache,
                                    endpoint=endpoint))
    check(entry, path, expected)
    if report:
        report(f"{entry.name}: {path} ({human_size(path.stat().st_size)}, sha256 {expected[:12]}... checked)")
    return path


def _hub_sha256(entry: Entry, endpoint: str | None) -> str:
    """The sha256 the Hub reports for the entry's file: its LFS object id, which the Hub sends as the file's etag."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    metadata = get_hf_file_metadata(hf_hub_url(entry.repo, entry.file, revision=entry.revision, endpoint=endpoint))
    if not is_sha256(metadata.etag):
        raise CheckpointError(f"the Hub reports no sha256 for {entry.file} in {entry.repo} (it is not an LFS file), "
                              "so edge cannot check it; download it yourself and pass the file's path")
    return metadata.etag


def check(entry: Entry, path: Path, expected: str) -> None:
    """Refuse a file whose sha256 is not `expected`: remove it from the cache and raise one line saying so."""
    actual = file_sha256(path)
    if actual == expected:
        return
    remove_cached(path)
    again = f"edge pull {entry.name}"
    raise CheckpointError(f"{entry.file} from {entry.repo} has sha256 {actual}, expected {expected}; the file was "
                          f"removed: run `{again}` to download it again (if it differs again, the file on the Hub is "
                          "not the one edge's catalogue lists)")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def remove_cached(path: Path) -> int:
    """Remove a file from the Hugging Face cache: the snapshot's link and the blob it points to (and the snapshot
    folder when that leaves it empty). The bytes freed."""
    blob = path.resolve()
    freed = blob.stat().st_size if blob.is_file() else 0
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)
    snapshot = path.parent
    while snapshot.parent.name == "snapshots" or snapshot.parent.parent.name == "snapshots":
        if any(snapshot.iterdir()):
            break
        snapshot.rmdir()
        snapshot = snapshot.parent
    return freed


def remove(name: str) -> tuple[Path, int]:
    """Remove a pulled catalogue model's file from the cache: (its path, the bytes freed); one line when it is not
    there."""
    entry = entry_for(name)
    path = pulled_file(entry, hub_cache_dir())
    if path is None and local_file(entry, hub_cache_dir()) is not None:
        from edge.sources.default_model import DEFAULT_MODEL

        raise CheckpointError(f"{entry.name} is the default model, installed with pip, not downloaded by edge; "
                              f"pip uninstall {DEFAULT_MODEL.distribution} removes it")
    if path is None:
        raise CheckpointError(f"{entry.name} is not downloaded (nothing to remove); `edge list` shows what is")
    return path, remove_cached(path)


@dataclass(frozen=True)
class Row:
    """One catalogue model as `edge list` shows it."""

    entry: Entry
    path: Path | None  # where it is pulled, or None

    @property
    def size(self) -> int | None:
        return self.path.stat().st_size if self.path is not None else self.entry.size


def rows() -> list[Row]:
    cache = hub_cache_dir()
    return [Row(entry, local_file(entry, cache)) for entry in load_catalogue().values()]


def human_size(size: int | None) -> str:
    if size is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def _download_problem(entry: Entry, error: Exception) -> str:
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = f"{entry.file} from {entry.repo}"
    if isinstance(error, GatedRepoError):
        return (f"{entry.repo} is gated on the Hugging Face Hub: accept its terms at https://huggingface.co/"
                f"{entry.repo} and log in with `hf auth login` (or set HF_TOKEN)")
    if isinstance(error, RevisionNotFoundError):
        return f"{entry.repo} has no revision {entry.revision!r}; name an existing branch, tag or commit"
    if isinstance(error, EntryNotFoundError):
        return f"{entry.repo} has no file {entry.file!r}; check the file name on https://huggingface.co/{entry.repo}"
    if isinstance(error, RepositoryNotFoundError):
        return f"no model {entry.repo} on the Hugging Face Hub (or it is private: log in with `hf auth login`)"
    unreachable = {kind.__name__ for kind in type(error).__mro__} & {"ConnectionError", "Timeout", "ConnectError",
                                                                     "TimeoutException", "OfflineModeIsEnabled"}
    reason = "the Hub could not be reached" if unreachable else \
        (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return (f"could not download {where} ({reason}); check the network connection and run `edge pull "
            f"{entry.name}` again: it resumes where it stopped")
