"""A GGUF file's header walked once, cheaply, before the `gguf` package reads it: every count, length and type
checked against what the file can hold.

The `gguf` package's reader walks a metadata array item by item in Python (~20 us an item), so a damaged count it
believes (one flipped byte makes a 320-item array 16.8 million items long) runs it for seconds on a small file and for
hours on a large one before it fails. This walk skips an array of numbers in one step and reads each string's length
only, and it refuses the file, naming the field, as soon as something cannot be true:

- a count, length or array larger than the bytes left in the file;
- an array longer than MAX_ARRAY_ITEMS (the largest vocabularies hold ~262 thousand tokens);
- a value or item type GGUF does not define, arrays nested deeper than MAX_NESTING;
- a tensor with no dimensions or more than MAX_DIMENSIONS (ggml's limit).

What the shapes and offsets mean is checked later, against the model (edge/sources/gguf_checkpoint.py).

    check_header(Path("model.gguf"))     # raises HeaderError("... tokenizer.ggml.token_type ...") or returns None
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from gguf import GGMLQuantizationType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # what the gguf package reads
MAX_ARRAY_ITEMS = 1 << 21  # 2,097,152: eight times the largest vocabulary in use (Gemma 3's 262,144)
MAX_METADATA_KEYS = 1 << 16
MAX_TENSORS = 1 << 20
MAX_DIMENSIONS = 4  # GGML_MAX_DIMS
MAX_NESTING = 2  # an array of arrays at most (GGUF allows it; no model file nests deeper)
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> bytes
STRING, ARRAY = 8, 9
TENSOR_TYPES = frozenset(kind.value for kind in GGMLQuantizationType)


class HeaderError(ValueError):
    """The header describes something the file cannot hold; the message names the field."""


class _Walk:
    def __init__(self, data, order: str) -> None:
        self.data, self.order, self.at, self.size = data, order, 0, len(data)

    def number(self, code: str, what: str) -> int:
        width = struct.calcsize(code)
        if self.at + width > self.size:
            raise HeaderError(f"the file ends inside {what}")
        (value,) = struct.unpack_from(self.order + code, self.data, self.at)
        self.at += width
        return value

    def skip(self, count: int, what: str) -> None:
        if count > self.size - self.at:
            raise HeaderError(f"{what} needs {count:,} bytes but the file has {self.size - self.at:,} left")
        self.at += count

    def string(self, what: str) -> bytes:
        length = self.number("Q", f"{what}'s length")
        start = self.at
        self.skip(length, what)
        return bytes(self.data[start:self.at])

    def value(self, kind: int, what: str, depth: int = 0) -> None:
        if kind in SCALAR_SIZES:
            self.skip(SCALAR_SIZES[kind], what)
        elif kind == STRING:
            self.skip(self.number("Q", f"{what}'s length"), what)
        elif kind == ARRAY:
            if depth >= MAX_NESTING:
                raise HeaderError(f"{what} nests arrays deeper than {MAX_NESTING}")
            item = self.number("I", f"{what}'s item type")
            count = self.number("Q", f"{what}'s length")
            if count > MAX_ARRAY_ITEMS:
                raise HeaderError(f"{what} claims {count:,} items, past any model's {MAX_ARRAY_ITEMS:,}")
            if item in SCALAR_SIZES:
                self.skip(count * SCALAR_SIZES[item], what)
            elif item in (STRING, ARRAY):
                smallest = 8 if item == STRING else 12  # a string's length; an array's item type and length
                if count * smallest > self.size - self.at:
                    raise HeaderError(f"{what} claims {count:,} items but the file has {self.size - self.at:,} "
                                      f"bytes left")
                for _ in range(count):
                    self.value(item, what, depth + 1)
            else:
                raise HeaderError(f"{what} has items of unknown type {item}")
        else:
            raise HeaderError(f"{what} has unknown value type {kind}")


def check_header(path: Path) -> None:
    """Raise HeaderError naming the first field of `path`'s header that the file cannot hold; None if all fit."""
    with open(path, "rb") as handle:
        if handle.read(4) != MAGIC:
            raise HeaderError("it does not start with GGUF's magic bytes")
        handle.seek(0, 2)
        if handle.tell() < 24:
            raise HeaderError("the file ends inside its header")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _walk(data)


def _walk(data) -> None:
    (version,) = struct.unpack_from("<I", data, 4)
    order = ">" if version & 0xFFFF == 0 else "<"  # a big-endian file (GGUFReader reads those too)
    walk = _Walk(data, order)
    walk.at = 4
    version = walk.number("I", "the version")
    if version > 255:
        raise HeaderError(f"its version field reads {version:,}: the header is damaged")
    if version not in SUPPORTED_VERSIONS:
        raise HeaderError(f"it is GGUF version {version}; edge reads versions 2 and 3, which current llama.cpp "
                          "writes")
    tensors = walk.number("Q", "the tensor count")
    keys = walk.number("Q", "the metadata count")
    if tensors > MAX_TENSORS:
        raise HeaderError(f"its tensor count {tensors:,} is past any model's ({MAX_TENSORS:,})")
    if keys > MAX_METADATA_KEYS:
        raise HeaderError(f"its metadata count {keys:,} is past any model's ({MAX_METADATA_KEYS:,})")
    for index in range(keys):
        key = _printable(walk.string(f"metadata key {index}"))
        walk.value(walk.number("I", f"{key}'s type"), key)
    for index in range(tensors):
        name = _printable(walk.string(f"tensor {index}'s name"))
        dimensions = walk.number("I", f"tensor {name}'s dimension count")
        if not 1 <= dimensions <= MAX_DIMENSIONS:
            raise HeaderError(f"tensor {name} has {dimensions:,} dimensions (1 to {MAX_DIMENSIONS})")
        walk.skip(8 * dimensions, f"tensor {name}'s shape")
        kind = walk.number("I", f"tensor {name}'s type")
        if kind not in TENSOR_TYPES:
            raise HeaderError(f"tensor {name} has type code {kind:,}, which GGUF does not define (a damaged header, "
                              "or a type newer than this gguf package)")
        walk.number("Q", f"tensor {name}'s offset")


def _printable(raw: bytes) -> str:
    """A key or tensor name as a message can quote it: on one line, control bytes as "?", at most 80 characters."""
    text = raw[:80].decode("utf-8", "replace")
    return "".join(char if char.isprintable() else "?" for char in text)
