"""Where each field of a GGUF file's header lies, so that a fuzzer can change one field at a time: the counts, every
metadata key's length and value type, scalar values, string and array lengths, array item types, and each tensor's
name length, number of dimensions, dimensions, type and data offset (GGUF v3, little-endian, as llama.cpp writes it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
ITEMS_KEPT = 4  # of an array's items, the first and the last few are fields (a vocabulary holds thousands)


@dataclass(frozen=True)
class Field:
    name: str  # "kv general.architecture value length", "tensor output.weight dim 0", ...
    offset: int
    format: str  # struct's code for the field's bytes: "Q", "I", "f", ...

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.format)

    def read(self, data: bytes | bytearray) -> int | float | bool:
        return struct.unpack_from("<" + self.format, data, self.offset)[0]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at, self.fields = data, 0, []

    def field(self, name: str, code: str) -> int | float | bool:
        item = Field(name, self.at, code)
        self.fields.append(item)
        self.at += item.size
        return item.read(self.data)

    def string(self, name: str) -> str:
        length = self.field(f"{name} length", "Q")
        text = self.data[self.at:self.at + length].decode("utf-8", "replace")
        self.at += length
        return text

    def value(self, name: str, kind: int, keep: bool = True) -> None:
        if kind == STRING:
            self.string(name) if keep else self._skip_string()
        elif kind == ARRAY:
            item_kind = self.field(f"{name} item type", "I")
            count = self.field(f"{name} count", "Q")
            for index in range(count):
                kept = index < ITEMS_KEPT or index >= count - ITEMS_KEPT
                self.value(f"{name}[{index}]", item_kind, keep=kept and item_kind != ARRAY)
        elif keep:
            self.field(f"{name} value", SCALARS[kind])
        else:
            self.at += struct.calcsize("<" + SCALARS[kind])

    def _skip_string(self) -> None:
        (length,) = struct.unpack_from("<Q", self.data, self.at)
        self.at += 8 + length


def header_fields(data: bytes) -> list[Field]:
    """Every field of the header of the valid GGUF file `data`, in file order."""
    reader = _Reader(data)
    reader.at = 4  # the magic "GGUF"
    reader.field("version", "I")
    tensors = reader.field("tensor count", "Q")
    keys = reader.field("metadata count", "Q")
    for _ in range(keys):
        key = reader.string("key")
        kind = reader.field(f"kv {key} type", "I")
        reader.value(f"kv {key}", kind)
    for _ in range(tensors):
        name = reader.string("tensor name")
        dims = reader.field(f"tensor {name} dimensions", "I")
        for dim in range(dims):
            reader.field(f"tensor {name} dim {dim}", "Q")
        reader.field(f"tensor {name} type", "I")
        reader.field(f"tensor {name} offset", "Q")
    return reader.fields


def header_end(fields: list[Field]) -> int:
    last = fields[-1]
    return last.offset + last.size
