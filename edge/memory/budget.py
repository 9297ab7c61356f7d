"""Memory sizes as people write them: "6GiB", "512 MiB", "1.5GB", "800000000"."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class BudgetError(ValueError):
    """A memory size that cannot be read, or a budget that cannot hold what it must."""


def parse_size(text: str) -> int:
    """Bytes in a size string; decimal (GB) and binary (GiB) units, case-insensitive."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise BudgetError(f"cannot read the memory size {text!r}; write a number with a unit, e.g. 6GiB, 512MiB "
                          "or 2GB")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise BudgetError(f"the memory size {text!r} is not positive; give e.g. 6GiB")
    return size


def format_size(size: int | float) -> str:
    """Binary units with three significant figures: 1536 -> '1.5 KiB'."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
