"""Ctrl+C (SIGINT) or SIGTERM stops edge-serve within a second or two: an open stream ends with an error event
(code server_shutting_down) and then [DONE], as streams that fail midway do, and nothing is logged as a traceback."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from edge.sources.builtin import builtin_model_path
from tests.helpers import sigint_as_from_a_terminal

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_signal_ends_open_streams_with_an_error_event_and_exits_at_once(sig, exit_code):
    server = subprocess.Popen([sys.executable, "-m", "edge.serve.cli", str(builtin_model_path()), "--port", "0",
                               "--drafter", "none"], stderr=subprocess.PIPE, text=True,
                              preexec_fn=sigint_as_from_a_terminal)
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(iter(server.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not (url := next((match[1] for line in log if (match := re.search(r"running on (http://\S+)", line))),
                               None)):
            assert time.monotonic() < deadline and server.poll() is None, "".join(log)
            time.sleep(0.1)
        while httpx.get(url + "/health").status_code != 200:
            time.sleep(0.1)
        body = {"prompt": "The json module", "max_tokens": 1900, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as stream:
            lines = stream.iter_lines()
            events = [next(line for line in lines if line) for _ in range(2)]  # the reply is under way
            server.send_signal(sig)
            signalled = time.monotonic()
            events += [line for line in lines if line]
        server.wait(timeout=30)
        stopped_s = time.monotonic() - signalled
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    reader.join(5)
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
    assert server.returncode == exit_code
    assert stopped_s < 5  # a second or two; generous for a busy machine
    output = "".join(log)
    assert "Traceback" not in output and "Exception in ASGI application" not in output, output
