"""Models named the way people name them: a folder, a .gguf file, or a Hugging Face Hub id.

    resolve_model("path/to/checkpoint")           # a folder: itself
    resolve_model("tinyllama.Q4_0.gguf")          # a GGUF file: converted once into a cached folder
    resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")        # the Hub: the local cache first, else a download
    resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct@main")   # ...at a revision (branch, tag or commit)
    resolve_model("TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF:Q4_0")                       # a GGUF in a repo, by tag
    resolve_model("TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF/tinyllama-1.1b-chat-v1.0.Q4_0.gguf")  # or by file
    resolve_model("qwen2.5-coder-1.5b")           # a name in edge's catalogue: the file `edge pull` downloaded

A path that exists always wins over a Hub id or a catalogue name of the same spelling. A catalogue name
(edge/sources/catalogue.py) is never downloaded here: one not pulled yet is an error saying `run: edge pull NAME`. A Hub id is looked up in the Hugging Face cache
first ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), so a model downloaded once (by edge or by
transformers) loads offline. When it is not there and HF_HUB_OFFLINE is not set, huggingface_hub downloads it into
that cache with its progress bar. Only what edge reads is fetched: model*.safetensors, the JSON files and chat
templates (*.jinja), or the one .gguf file asked for; never pickled weights (*.bin, *.pt). Every failure is one
CheckpointError line naming the problem and a fix.
"""

from __future__ import annotations

import json
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from edge.errors import CheckpointError
from edge.files import special_kind
from edge.sources.catalogue import local_file, lookup, not_pulled

DOWNLOAD_PATTERNS = ["model*.safetensors", "*.json", "*.jinja"]
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[^\s:@/]+))?"
                     rf"(?::(?P<tag>[A-Za-z0-9._-]+)|/(?P<file>[^\s]+\.gguf))?")
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubName:
    """A model named on the Hugging Face Hub: repo, optional revision, optional GGUF file or quantization tag."""

    repo: str
    revision: str | None = None
    tag: str | None = None  # pick the repo's .gguf file whose name carries this tag (Q4_0, q8_0, Q4_K_M)
    file: str | None = None  # this .gguf file of the repo

    @classmethod
    def parse(cls, text: str) -> "HubName | None":
        """The Hub id `text` spells, or None when it is not shaped like one (it is then a local path)."""
        match = _HUB_ID.fullmatch(text)
        if match is None or text.startswith((".", "~")) or ".." in match["repo"] or "--" in match["repo"]:
            return None
        return cls(match["repo"], match["revision"], match["tag"], match["file"])

    def __str__(self) -> str:
        revision = f"@{self.revision}" if self.revision else ""
        return self.repo + revision + (f":{self.tag}" if self.tag else f"/{self.file}" if self.file else "")


def resolve_model(name: str | Path, *, progress: bool = True) -> Path:
    """The checkpoint folder `name` stands for (see the module docstring). With `progress`, a download shows
    huggingface_hub's progress bars and a GGUF conversion says so once on stderr; without it, both are silent.
    A path that does not exist and is not shaped like a Hub id comes back unchanged (the loader then says it is
    missing)."""
    path = Path(name).expanduser()
    report = _stderr if progress else None
    if path.is_dir():
        return path
    if path.is_file():
        return _from_file(path, report)
    entry = lookup(str(name))
    if entry is not None:
        found = local_file(entry, hub_cache_dir())
        if found is None:
            raise not_pulled(entry)
        return _from_file(found, report)
    kind = special_kind(path)
    if kind is not None:  # a pipe, a device, a dangling symlink: never read, never taken for a Hub id
        raise CheckpointError(f"{path} is {kind}, not a model; pass a checkpoint folder (holding config.json), a "
                              ".gguf file or a Hub id (org/name)")
    hub = HubName.parse(str(name)) if not Path(name).is_absolute() else None
    if hub is None and path.suffix.lower() == ".gguf":
        raise CheckpointError(f"{path} does not exist; pass an existing .gguf file")
    if hub is None:
        return path
    return _from_hub(hub, progress, report)


def named_model_file(model: str) -> Path:
    """A named model's file: the path given, or a catalogue model's file where it is on this machine (as
    resolve_model finds it: pulled, or the pip-installed default model)."""
    entry = lookup(model) if not Path(model).exists() else None
    found = local_file(entry, hub_cache_dir()) if entry is not None else None
    return found if found is not None else Path(model)


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps its downloads, read from the environment now (huggingface_hub itself reads it
    once, at import)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def display_name(folder: Path) -> str:
    """A short name for a resolved folder: org/name for a Hub snapshot, the folder's own name otherwise."""
    parts = folder.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/")
    return folder.name


def _stderr(message: str) -> None:
    print(f"edge: {message}", file=sys.stderr, flush=True)


def _from_file(path: Path, report: Callable[[str], None] | None) -> Path:
    from edge.sources.gguf_checkpoint import checkpoint_from_gguf  # here: `edge list` and `edge pull` skip torch

    if path.suffix.lower() == ".gguf":
        return checkpoint_from_gguf(path, report=report)
    if path.suffix.lower() in (".bin", ".pt", ".pth", ".pkl", ".ckpt"):
        raise CheckpointError(f"{path} is a pickled weights file, which edge never loads (it can run code); pass "
                              "a checkpoint folder with *.safetensors weights or a .gguf file")
    raise CheckpointError(f"{path} is a file; pass the checkpoint folder that holds it (config.json, "
                          "*.safetensors, tokenizer.json), a .gguf file or a Hub id (org/name)")


# ---- the Hugging Face Hub -----------------------------------------------------------------------------------


def _from_hub(hub: HubName, progress: bool, report: Callable[[str], None] | None) -> Path:
    cache, offline = hub_cache_dir(), hub_offline()
    snapshot = _cached_snapshot(hub, cache)
    found = _usable(hub, snapshot, offline) if snapshot is not None else None
    if found is None and offline:
        where = f"only partly in the Hugging Face cache ({snapshot})" if snapshot is not None else \
            f"not in the Hugging Face cache at {cache}"
        raise CheckpointError(f"{hub} is {where} and HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE to download it, "
                              f"point HF_HOME at the cache that holds it, or pass a checkpoint folder (no folder "
                              f"named {hub} exists here)")
    if found is None:
        found = _download(hub, cache, progress)
    return _from_file(found, report) if found.suffix == ".gguf" else found


def _cached_snapshot(hub: HubName, cache: Path) -> Path | None:
    """The snapshot folder of the revision asked for, when the cache has one (its files may be incomplete)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(hub.repo, revision=hub.revision, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def _usable(hub: HubName, snapshot: Path, offline: bool) -> Path | None:
    """What in a snapshot folder edge would load: the checkpoint folder when complete, the .gguf file asked for
    (or the repo's only one); None when that is not (all) there. Offline, several cached .gguf files and no tag
    to choose among them is an error naming them."""
    if hub.file is not None:
        return snapshot / hub.file if (snapshot / hub.file).is_file() else None
    ggufs = sorted(str(path.relative_to(snapshot)) for path in snapshot.rglob("*.gguf"))
    if hub.tag is not None or (ggufs and not (snapshot / "config.json").is_file()):
        chosen = _pick_gguf(hub, ggufs, several_is_error=offline, none_is_error=False)
        return snapshot / chosen if chosen is not None else None
    return snapshot if _complete_checkpoint(snapshot) else None


def _complete_checkpoint(folder: Path) -> bool:
    if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
        return False
    if (folder / "model.safetensors").is_file():
        return True
    index = folder / "model.safetensors.index.json"
    try:
        shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return all((folder / shard).is_file() for shard in shards)


def _pick_gguf(hub: HubName, ggufs: list[str], *, several_is_error: bool, none_is_error: bool) -> str | None:
    """The .gguf file `hub` asks for among `ggufs`: the one carrying its tag, or the only one. Several that fit,
    or none, is None or an error naming the choices."""
    tag = (hub.tag or "").lower()
    matching = [name for name in ggufs if not tag or re.search(rf"(^|[^a-z0-9]){re.escape(tag)}([^a-z0-9]|$)",
                                                                 Path(name).stem.lower())]
    if len(matching) == 1:
        return matching[0]
    choices = ", ".join(f"{hub.repo}:{tag_}" for tag_ in sorted({_quant_tag(name) for name in ggufs})[:8])
    if matching and several_is_error:
        raise CheckpointError(f"{hub} fits several .gguf files ({', '.join(matching[:4])}); pick one: {choices}, "
                              f"or name the file: {hub.repo}/{matching[0]}")
    if not matching and none_is_error:
        raise CheckpointError(f"{hub.repo} has no .gguf file tagged {hub.tag}; pick one of its files: {choices}")
    return None


def _quant_tag(name: str) -> str:
    """The quantization part of a GGUF file name (model.Q4_K_M.gguf -> Q4_K_M), or the whole stem."""
    stem = Path(name).stem
    found = re.search(r"(?i)(?:^|[.-])((?:i?q\d[\w]*)|f16|f32|bf16)$", stem)
    return found.group(1) if found else stem


def _download(hub: HubName, cache: Path, progress: bool) -> Path:
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    with hub_call(lambda error: _download_problem(hub, error), progress):
        if hub.file is None:
            files = HfApi().list_repo_files(hub.repo, revision=hub.revision)
            has_weights = any(re.fullmatch(r"model.*\.safetensors", name) for name in files)
            ggufs = sorted(name for name in files if name.endswith(".gguf"))
            if hub.tag is None and has_weights:
                return Path(snapshot_download(hub.repo, revision=hub.revision, cache_dir=cache,
                                              allow_patterns=DOWNLOAD_PATTERNS))
            if not ggufs:
                raise CheckpointError(f"{hub.repo} has no safetensors weights (model*.safetensors) and no .gguf "
                                      "file; edge never loads pickled *.bin weights: pick a repo with safetensors "
                                      "or GGUF files")
            chosen = _pick_gguf(hub, ggufs, several_is_error=True, none_is_error=True)
        else:
            chosen = hub.file
        return Path(hf_hub_download(hub.repo, chosen, revision=hub.revision, cache_dir=cache))


@contextmanager
def hub_call(problem: Callable[[Exception], str], progress: bool) -> Iterator[None]:
    """Around huggingface_hub's calls: its progress bars off unless `progress`, and any of its (or requests') errors
    as one CheckpointError line that `problem` words."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = not progress and not are_progress_bars_disabled()
    if quiet:
        disable_progress_bars()
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:  # huggingface_hub's and requests' errors, one line each
        raise CheckpointError(problem(error)) from None
    finally:
        if quiet:
            enable_progress_bars()


def _download_problem(hub: HubName, error: Exception) -> str:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, GatedRepoError):
        return (f"{hub.repo} is gated on the Hugging Face Hub: accept its terms at https://huggingface.co/{hub.repo} "
                "and log in with `hf auth login` (or set HF_TOKEN)")
    if isinstance(error, RevisionNotFoundError):
        return f"{hub.repo} has no revision {hub.revision!r}; name an existing branch, tag or commit after the @"
    if isinstance(error, EntryNotFoundError):
        return f"{hub.repo} has no file {hub.file!r}; check the file name on https://huggingface.co/{hub.repo}"
    if isinstance(error, RepositoryNotFoundError):
        return (f"no folder {hub} here and no model {hub.repo} on the Hugging Face Hub (or it is private: log in "
                "with `hf auth login`); check the spelling, or pass a checkpoint folder")
    unreachable = {kind.__name__ for kind in type(error).__mro__} & {"ConnectionError", "Timeout", "ConnectError",
                                                                     "TimeoutException", "OfflineModeIsEnabled"}
    reason = "huggingface.co could not be reached" if unreachable else \
        (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return (f"could not download {hub} from the Hugging Face Hub ({reason}), and it is not in the cache at "
            f"{hub_cache_dir()}; check the network connection, or pass a checkpoint folder")
