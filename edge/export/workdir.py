"""The folder an export works in, beside its output, and the ones killed exports left behind.

    work = WorkFolder.create(Path("model.bundle"))   # .model.bundle.partial-XXXX, locked while this process runs
    ...                                              # write, validate, rename work.path to the output
    work.remove()                                    # whatever is left of it, then the lock

The lock is an flock on the folder itself, which the kernel releases when the process ends however it ends (SIGKILL,
a power cut aside). So a work folder of the same output that no process holds is an export that died, and
`remove_stale_work_folders` deletes it; one an export still holds (two exports of one output at once) is left alone.
Without flock (Windows) nothing is treated as stale.
"""

from __future__ import annotations

import os
import shutil
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; stale folders are left for the user
    fcntl = None


@dataclass
class WorkFolder:
    path: Path
    descriptor: int | None  # an open descriptor of the folder, holding its lock

    @classmethod
    def create(cls, output: Path) -> "WorkFolder":
        """A new, locked work folder for `output` (raises OSError when its parent cannot be written)."""
        while True:
            path = output.parent / f".{output.name}.partial-{secrets.token_hex(4)}"
            descriptor = None
            try:
                os.mkdir(path, 0o700)
                descriptor = _lock(path, wait=True)
                if path.is_dir():  # not taken for stale by another export between its creation and its lock
                    return cls(path, descriptor)
            except FileExistsError:  # that name is taken: draw another
                continue
            except BaseException:  # Ctrl+C or a stop signal before the folder was handed over: nothing stays
                shutil.rmtree(path, ignore_errors=True)
                if descriptor is not None:
                    os.close(descriptor)
                raise
            if descriptor is not None:
                os.close(descriptor)

    def remove(self) -> None:
        """Delete what is left of the folder (nothing, once it was renamed into place), then release its lock."""
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


def work_folders(output: Path) -> list[Path]:
    """The work folders of exports to `output` (finished or not) beside it."""
    return sorted(path for path in output.parent.glob(f".{output.name}.partial-*") if path.is_dir()
                  and not path.is_symlink())


def remove_stale_work_folders(output: Path, settle_s: float = 1.0) -> list[Path]:
    """Delete the work folders of `output` that no running export holds; return them. A lock is tried for up to
    `settle_s`: a killed export's child between its fork and its exec still holds the lock for a moment after the
    export itself is gone, where a running export holds it for minutes."""
    removed = []
    for path in work_folders(output):
        descriptor = _lock(path, wait=False)
        deadline = time.monotonic() + settle_s
        while descriptor is None and fcntl is not None and time.monotonic() < deadline:
            time.sleep(0.02)
            descriptor = _lock(path, wait=False)
        if descriptor is None:  # held by a running export, or not lockable here
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(descriptor)
        removed.append(path)
    return removed


def _lock(path: Path, *, wait: bool) -> int | None:
    """An open descriptor of the folder `path` holding its exclusive lock; None when another process holds it (with
    `wait` False), when it cannot be opened, or without flock."""
    if fcntl is None:
        return None
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        os.close(descriptor)
        return None
    return descriptor
