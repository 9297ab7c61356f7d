"""Run a function from untrusted input in a separate process with hard limits on its time and memory.

    result = call("edge.text.chat_template:render_request", request, seconds=5.0, memory=512 * 2**20)

The function runs in a small worker process (`python -m edge.text.limited_process`), started once and reused, so a
call costs a round trip through a pipe, not a process start. Before each call the worker sets its own resource limits:
RLIMIT_CPU (the kernel ends it past the call's CPU time) and RLIMIT_AS (its allocations fail past the call's memory,
a MemoryError). The caller waits for the reply with a deadline and kills the worker when it runs past, so work the
function does inside C code (where no Python-level check runs) is bounded too. The wait is a `select` with a
timeout, so the caller's signal handlers (SIGTERM, Ctrl+C) run during it; a call that does not finish for any reason
kills its worker, and the next call starts a fresh one.

Requests go to the worker pickled (they come from this process); replies come back as JSON (they come from code
that ran untrusted input), so nothing the worker sends is unpickled. The function's result must be JSON.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from importlib import import_module
from pathlib import Path
from typing import Any

_HEADER = struct.Struct(">Q")  # each message: its length, then its bytes
START_SECONDS = 60.0  # how long a worker may take to start (imports on a busy machine)
GRACE_SECONDS = 1.0  # past the call's own time limit, before the worker is killed
IDLE_WORKERS = 4  # workers kept for reuse; more are started while calls overlap, and closed after


class LimitExceeded(Exception):
    """The call ran past its time (`reason` "time") or memory ("memory") limit, or its worker ended without a reply
    ("crash"); `detail` says how, as a predicate ("ran past its 5 s limit and was stopped")."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class WorkerError(RuntimeError):
    """The worker process could not be started or spoke out of turn (never the function's input's fault)."""


class RequestError(ValueError):
    """The request holds a value that cannot be sent to the worker (pickled here, or unpickled there)."""


# ---------------------------------------------------------------------------------------------------------------
# The caller's side
# ---------------------------------------------------------------------------------------------------------------


def call(function: str, request: Any, *, seconds: float, memory: int) -> Any:
    """`function(request)` ("module:name") in a worker process within `seconds` (CPU and wall time) and `memory`
    bytes besides what the worker holds already. LimitExceeded past a limit; WorkerError when no worker starts."""
    try:
        payload = pickle.dumps((function, request, seconds, memory), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise RequestError(f"{type(error).__name__}: {error}") from None
    worker = _pool.take()
    finished = False
    try:
        result = worker.exchange(payload, seconds + GRACE_SECONDS)
        finished = True
    finally:
        if finished and result.get("healthy", True):
            _pool.give_back(worker)
        else:  # a limit, a crash, or an interrupt (SIGTERM, Ctrl+C) in the wait: the worker is in an unknown state
            worker.kill()
    if "limit" in result:
        raise LimitExceeded(result["limit"], result["detail"])
    if "unreadable" in result:
        raise RequestError(result["unreadable"])
    return result["value"]


class _Worker:
    """One worker process and its two pipes."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # the folder holding the edge package
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "edge.text.limited_process"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)
        except OSError as error:
            raise WorkerError(f"cannot start a worker process ({sys.executable}): {error.strerror or error}") from None
        self.owner = os.getpid()  # a forked child inherits this object, not the worker
        _live.add(self)
        try:
            ready = self._read(time.monotonic() + START_SECONDS)
        except TimeoutError:
            self.kill()
            raise WorkerError(f"the worker process ({sys.executable}) did not start within {START_SECONDS:g} s") \
                from None
        except BaseException:
            self.kill()
            raise
        if ready != b"ready":
            self.kill()
            raise WorkerError(f"the worker process ({sys.executable}) did not start: exit status "
                              f"{self.process.poll()}")

    def exchange(self, payload: bytes, seconds: float) -> dict:
        """Send one request; its reply, or a {"limit", "detail"} dict when the worker ran past `seconds` or died."""
        try:
            self._write(payload)
        except BrokenPipeError:
            return self._ended()
        deadline = time.monotonic() + seconds
        try:
            reply = self._read(deadline)
        except TimeoutError:
            self.kill()
            return {"limit": "time", "detail": f"ran past its {seconds - GRACE_SECONDS:g} s limit and was "
                                               "stopped", "healthy": False}
        if reply is None:
            return self._ended()
        return json.loads(reply)

    def _ended(self) -> dict:
        """The reply for a worker that ended without answering: how it ended."""
        try:
            status = self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            status = self.process.returncode
        if status == -getattr(signal, "SIGXCPU", -1):
            detail, reason = "ran past its CPU time limit and was stopped", "time"
        elif status == -signal.SIGKILL:
            detail, reason = "was killed (out of memory?)", "memory"
        else:
            detail, reason = f"ended its process without a reply (exit status {status})", "crash"
        return {"limit": reason, "detail": detail, "healthy": False}

    def _write(self, data: bytes) -> None:
        stream = self.process.stdin
        stream.write(_HEADER.pack(len(data)) + data)
        stream.flush()

    def _read(self, deadline: float) -> bytes | None:
        """One message from the worker; None at the end of its output; TimeoutError past `deadline`."""
        header = self._read_exactly(_HEADER.size, deadline)
        if header is None:
            return None
        body = self._read_exactly(_HEADER.unpack(header)[0], deadline)
        if body is None:
            return None
        return body

    def _read_exactly(self, size: int, deadline: float) -> bytes | None:
        fd, chunks, left = self.process.stdout.fileno(), [], size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            readable, _, _ = select.select([fd], [], [], remaining)  # signal handlers run while this waits
            if not readable:
                continue
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        """End the worker now (it may be in the middle of a call)."""
        _live.discard(self)
        if self.process.poll() is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """End an idle worker: the end of its input tells it to exit."""
        _live.discard(self)
        try:
            self.process.stdin.close()
            self.process.wait(1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class _Pool:
    """Idle workers for reuse, per process (a forked child starts its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._pid = os.getpid()

    def take(self) -> _Worker:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's workers answer the parent
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    return worker
                worker.kill()
        return _Worker()

    def give_back(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < IDLE_WORKERS and self._pid == os.getpid():
                self._idle.append(worker)
                return
        worker.close()


_pool = _Pool()
_live: weakref.WeakSet[_Worker] = weakref.WeakSet()


@atexit.register
def _end_workers() -> None:
    """At exit, idle and busy workers alike end with this process (a forked child's copies are its parent's)."""
    for worker in list(_live):
        if worker.owner == os.getpid():
            worker.kill()


# ---------------------------------------------------------------------------------------------------------------
# The worker's side
# ---------------------------------------------------------------------------------------------------------------


def _address_space() -> int | None:
    """This process's address space in bytes (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _set_limits(seconds: float, memory: int | None) -> None:
    """This call's limits: CPU time from now, and an address space `memory` bytes over the present one (None:
    none). Only the soft limits move, so that the next call can raise them again."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu_now = used.ru_utime + used.ru_stime
    for kind, wanted in ((resource.RLIMIT_CPU, math.ceil(cpu_now + seconds + GRACE_SECONDS)),
                         (resource.RLIMIT_AS, None if memory is None else _address_space_limit(memory))):
        _, hard = resource.getrlimit(kind)
        soft = resource.RLIM_INFINITY if wanted is None else wanted
        if hard != resource.RLIM_INFINITY:
            soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        try:
            resource.setrlimit(kind, (soft, hard))
        except (ValueError, OSError):  # a platform that does not enforce it (RLIMIT_AS on macOS)
            pass


def _address_space_limit(memory: int) -> int | None:
    present = _address_space()
    return None if present is None else present + memory


def _serve(requests: Any, replies: Any) -> None:
    """Answer requests until the end of the input: each is (function, request, seconds, memory)."""
    functions: dict[str, Any] = {}

    def send(message: bytes) -> None:
        replies.write(_HEADER.pack(len(message)) + message)
        replies.flush()

    def receive() -> bytes | None:
        header = requests.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        body = requests.read(_HEADER.unpack(header)[0])
        return body

    send(b"ready")
    while (message := receive()) is not None:
        try:
            name, request, seconds, memory = pickle.loads(message)
        except Exception as error:  # noqa: BLE001 - a class this process cannot import, say
            send(json.dumps({"unreadable": f"{type(error).__name__}: {error}"}).encode())
            continue
        if name not in functions:
            module, _, attribute = name.partition(":")
            functions[name] = getattr(import_module(module), attribute)
        _set_limits(seconds, memory)
        try:
            reply = {"value": functions[name](request)}
        except MemoryError:
            reply = {"limit": "memory", "detail": f"ran out of its {memory // 2**20:,} MiB of memory",
                     "healthy": False}
        except RecursionError:
            reply = {"limit": "memory", "detail": "recursed too deep", "healthy": False}
        except Exception as error:  # noqa: BLE001 - the function's own failure, reported instead of a dead worker
            reply = {"limit": "crash", "detail": f"failed: {type(error).__name__}: {error}", "healthy": False}
        finally:
            _set_limits(seconds, None)
        text = json.dumps(reply).encode()
        del reply
        send(text)
        if "limit" in json.loads(text):
            return  # the caller discards a worker that ran out of something; so does the worker itself


def _main() -> None:
    """The worker process: requests on stdin, replies on stdout (moved off fd 1, so that nothing printed by
    accident can be taken for a reply)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides when a call ends
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file when the CPU limit ends it
    except (ImportError, ValueError, OSError):
        pass
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    _main()
