"""Draft models found among the user's own files: a GGUF file beside the target with the same tokenizer and a fraction
of its size (as LM Studio's draft-compatibility check pairs models), which edge-chat and edge-serve then draft with.

    drafts_beside(Path("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))   # [.../qwen2.5-coder-0.5b-instruct-q4_0.gguf]

Only the files' headers are read: the tokenizer's token list is hashed as its bytes lie in the header (a
152k-token list in well under a second), so a folder of large files is checked without loading any of them. The
adaptive draft length then measures whether the draft pays and pauses it where it does not, so offering one costs
little when it turns out slower than plain decoding.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from pathlib import Path

DRAFT_SHARE = 0.5  # a draft file is at most this share of the target file's size
TOKENS_KEY = b"tokenizer.ggml.tokens"
# GGUF value types: their fixed sizes (strings and arrays are read apart)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def drafts_beside(target: str | Path) -> list[Path]:
    """GGUF files in `target`'s folder with its tokenizer and at most DRAFT_SHARE of its size, smallest first."""
    target = Path(target)
    if target.suffix.lower() != ".gguf" or not target.is_file():
        return []
    own = tokenizer_fingerprint(target)
    if own is None:
        return []
    limit = DRAFT_SHARE * target.stat().st_size
    found = []
    for candidate in sorted(target.parent.glob("*.gguf")):
        try:
            small = candidate.is_file() and candidate.stat().st_size <= limit
        except OSError:
            continue
        if small and candidate.resolve() != target.resolve() and tokenizer_fingerprint(candidate) == own:
            found.append(candidate)
    return sorted(found, key=lambda path: path.stat().st_size)


def tokenizer_fingerprint(path: str | Path) -> str | None:
    """sha256 of a GGUF file's token list as stored (every token's length and bytes), or None where the file has
    none or is not a readable GGUF file."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped, \
                memoryview(mapped) as data:
            return _tokens_hash(data)
    except (OSError, ValueError, struct.error, IndexError):
        return None


def _tokens_hash(data: memoryview) -> str | None:
    if bytes(data[:4]) != b"GGUF":
        return None
    version, _, pairs = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        return None
    at = 24
    for _ in range(pairs):
        key, at = _string(data, at)
        (kind,) = struct.unpack_from("<I", data, at)
        at += 4
        start = at
        at = _skip(data, at, kind)
        if key == TOKENS_KEY:
            with data[start:at] as tokens:
                return hashlib.sha256(tokens).hexdigest()
    return None


def _string(data: memoryview, at: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<Q", data, at)
    return bytes(data[at + 8:at + 8 + length]), at + 8 + length


def _skip(data: memoryview, at: int, kind: int) -> int:
    """The offset after a value of `kind` that starts at `at`."""
    if kind in _FIXED:
        return at + _FIXED[kind]
    if kind == _STRING:
        (length,) = struct.unpack_from("<Q", data, at)
        return at + 8 + length
    if kind == _ARRAY:
        element, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if element in _FIXED:
            return at + count * _FIXED[element]
        for _ in range(count):
            at = _skip(data, at, element)
        return at
    raise ValueError(f"unknown GGUF value type {kind}")
