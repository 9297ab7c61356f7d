"""The OpenMP team a thread keeps after its parallel work, released when that thread ends a load or a reply.

libgomp (edge's kernels and torch share torch's copy) gives each thread that starts a parallel region a team of
worker threads and keeps it until that thread exits. While more such threads are alive than the machine has cores,
it cuts every team's spinning at barriers to almost nothing, so workers sleep and are woken at each of the many
barriers a token takes. A model loaded on one thread and run on another (edge-serve loads on its main thread and
decodes on its generation thread; the chat app's workers are a thread pool's and outlive their work) decoded at
55-65% of its speed on 2 cores. So a thread releases its team when it finishes a load or a reply; the next parallel
region, on whichever thread, builds one again (a thread created: microseconds).

    release_thread_team()      # the calling thread's team, where libgomp is loaded; else nothing
"""

from __future__ import annotations

import ctypes
import functools
import os

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: threads released, state kept
# GCC's (torch's Linux wheels): its pause frees the calling thread's team alone. LLVM's and Intel's pause their whole
# runtime, every thread's team, which another thread may be using: left alone.
RUNTIMES = ("libgomp.so.1",)


@functools.cache
def _pause_resource_all():
    """The loaded libgomp's omp_pause_resource_all (OpenMP 5.0), or None; never loads a runtime itself."""
    for name in RUNTIMES:
        try:
            runtime = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        pause = getattr(runtime, "omp_pause_resource_all", None)  # int (int kind): ctypes' default call suits it
        if pause is not None:
            return pause
    return None


def release_thread_team() -> None:
    """Release the calling thread's OpenMP team (outside any parallel region; a no-op without libgomp)."""
    pause = _pause_resource_all()
    if pause is not None:
        pause(ctypes.c_int(OMP_PAUSE_SOFT))
