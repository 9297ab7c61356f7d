"""How much memory the device has for us: CPU RAM (respecting a container's cgroup limit) or a CUDA GPU's free
memory, minus a safety margin; or the user's budget, which overrides the probe."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from edge.memory.budget import BudgetError, parse_size

SAFETY_MARGIN = 0.10  # keep 10% of what is free for the OS, the allocator and everything else


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "cpu" or "cuda:N"
    total: int  # bytes the device (or the container) has
    available: int  # bytes free now
    budget: int  # bytes edge may plan for
    source: str  # where the budget came from: "psutil", "cgroup v2", "cgroup v1", "cuda", "--memory-budget"

    def to_dict(self) -> dict:
        return asdict(self)


def probe(device: str = "cpu", budget: str | int | None = None, cgroup_root: Path = Path("/sys/fs/cgroup")
          ) -> DeviceMemory:
    """Measure the device; a `budget` ("6GiB" or bytes) replaces the measured one."""
    if device.startswith("cuda"):
        total, available, source = *_cuda(device), "cuda"
    else:
        memory = psutil.virtual_memory()
        total, available, source = memory.total, memory.available, "psutil"
        limit = _cgroup_limit(cgroup_root)
        if limit is not None and limit[0] < available:
            total, available, source = min(total, limit[0] + limit[1]), limit[0], limit[2]
    planned = int(available * (1 - SAFETY_MARGIN))
    if budget is not None:
        planned, source = (budget if isinstance(budget, int) else parse_size(budget)), "--memory-budget"
    return DeviceMemory(device, total, available, planned, source)


def _cuda(device: str) -> tuple[int, int]:
    import torch

    if not torch.cuda.is_available():
        raise BudgetError(f"device {device!r}: torch sees no CUDA GPU here; use --device cpu")
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return total, free


def _cgroup_limit(root: Path) -> tuple[int, int, str] | None:
    """(bytes left under the container's limit, bytes it uses now, which cgroup version) or None if unlimited."""
    for limit_file, usage_file, name in (("memory.max", "memory.current", "cgroup v2"),
                                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "cgroup v1")):
        try:
            limit_text = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= 1 << 60:
            return None  # no limit set (cgroup v1 reports a huge number)
        return max(int(limit_text) - usage, 0), usage, name
    return None


def return_freed_heap() -> None:
    """Hand the C heap's free pages back to the OS. glibc keeps what a load's short-lived buffers freed (a
    tokenizer's JSON parse: about 30 MiB for a 49k vocabulary) as its own, resident until reused; malloc_trim
    returns them. Nothing happens where the C library has no malloc_trim (macOS, musl)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
