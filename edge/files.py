"""Reading files a user or a download put in place, without trusting what they are.

    kind = special_kind(path)                   # None for a regular file, a folder or nothing; else what it is
    data = read_regular(path, limit=1 << 20)    # bytes of a regular file of at most `limit` bytes, or FileRefused

A name can hold a named pipe (reading it waits for a writer for ever), a symlink to /dev/zero (reading it never
ends) or a file far larger than anything edge writes there. `read_regular` opens without blocking, checks what it
opened is a regular file no larger than the limit, and reads at most the limit; each refusal is one line naming
what the path is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRefused(OSError):
    """A path that is not a regular file, or is larger than the reader allows; `reason` says which, in a few words
    ("a named pipe", "a symlink to /dev/zero, a character device", "12.0 MiB, over the 8.0 MiB limit")."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} is {reason}")
        self.path, self.reason = path, reason


def special_kind(path: str | Path) -> str | None:
    """What `path` is when it is neither a regular file nor a folder nor absent: "a character device", "a named
    pipe", ..., or a symlink to one ("a symlink to /dev/zero, a character device"); None otherwise."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"a symlink to {os.readlink(path)}, which does not exist" if os.path.islink(path) else None
    except OSError as error:
        return f"unreadable ({error.strerror or error})"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return _described(path, mode)


def _described(path: str | Path, mode: int) -> str:
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    return f"a symlink to {os.path.realpath(path)}, {kind}" if os.path.islink(path) else kind


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at `path` (a symlink to one is followed); FileRefused when it is something
    else or larger than `limit` bytes, OSError (FileNotFoundError, PermissionError...) when it cannot be opened."""
    path = Path(path)
    kind = special_kind(path)
    if kind is not None:  # never opened: opening some devices has effects of its own
        raise FileRefused(path, kind)
    if path.is_dir():
        raise FileRefused(path, "a folder")
    nonblocking = getattr(os, "O_NONBLOCK", 0)  # a pipe swapped in since the check cannot block the open
    with open(path, "rb", opener=lambda name, flags: os.open(name, flags | nonblocking)) as handle:
        status = os.fstat(handle.fileno())
        mode, size = status.st_mode, status.st_size
        if not stat.S_ISREG(mode):
            raise FileRefused(path, _described(path, mode))
        if size > limit:
            raise FileRefused(path, f"{_size(size)}, over the {_size(limit)} a file here may hold")
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise FileRefused(path, f"over the {_size(limit)} a file here may hold")
    return data


def _size(count: int) -> str:
    return f"{count} bytes" if count < 1 << 10 else f"{count / 2**10:.1f} KiB" if count < 1 << 20 else \
        f"{count / 2**20:.1f} MiB"
