"""What a benchmark worker measures of its own process (worker.py, suite_worker.py)."""

from __future__ import annotations

import resource


def peak_rss_mib() -> float:
    """The process's peak resident memory so far (ru_maxrss, the kernel's high-water mark), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
