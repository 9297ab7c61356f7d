"""llama.cpp's own server as a peer in edge-bench's suite: its plain decoding, its n-gram modes and its draft-model
mode, on the same GGUF files and fed the same token ids as edge.

    server = LlamaServer(binary, target_gguf, mode="draft-simple", draft=draft_gguf, threads=2)
    ids, stats = server.greedy(prompt_ids, new_tokens)     # stats: llama.cpp's drafted and accepted token counts
    server.close()

`binary` is a llama-server built from llama.cpp's source (cmake --build BUILD --target llama-server; the sdist of
llama-cpp-python holds it in vendor/llama.cpp): --llama-server PATH, else $EDGE_LLAMA_SERVER, else llama-server on
PATH. Each mode is one server process for the whole run (one slot, the suite's context), asked for greedy
completions of token ids over HTTP with prompt caching off, so every request prefills afresh as edge's runs do.
The n-gram modes remember what earlier requests generated (ngram-mod pools n-grams across requests), which on a
benchmark that asks the same prompts pass after pass would draft whole replies from memory: their server is
restarted before each request (`restart`, outside the timed call), so each reply starts as edge's do, from the
conversation alone.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from edge.errors import EdgeError

# llama-server --spec-type values: plain decoding, its n-gram drafters and its classic draft model
PLAIN, DRAFT_MODEL = "none", "draft-simple"
NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-mod")  # some keep n-grams across requests: restarted for each
START_TIMEOUT_S = 120


def find_binary(explicit: str | Path | None = None) -> Path | None:
    """The llama-server executable: `explicit`, else $EDGE_LLAMA_SERVER, else one on PATH; None where there is none."""
    given = explicit or os.environ.get("EDGE_LLAMA_SERVER")
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EdgeError(f"{given} is not an executable llama-server; build one with cmake from llama.cpp's "
                            "source (--target llama-server) and pass its path")
        return path
    found = shutil.which("llama-server")
    return Path(found) if found else None


def method_name(mode: str, target: Path, draft: Path | None = None) -> str:
    """The suite's method string for a server mode: llama-server:MODE:TARGET[@DRAFT]."""
    return f"llama-server:{mode}:{target}" + (f"@{draft}" if draft else "")


def parse_method(method: str) -> tuple[str, Path, Path | None]:
    """llama-server:MODE:TARGET[@DRAFT] -> (mode, target, draft)."""
    _, mode, rest = method.split(":", 2)
    target, _, draft = rest.partition("@")
    return mode, Path(target), Path(draft) if draft else None


def label(method: str) -> str:
    mode, target, draft = parse_method(method)
    name = "plain" if mode == PLAIN else mode
    return f"llama.cpp server {name}" + (f" (draft {draft.stem})" if draft else "")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LlamaServer:
    def __init__(self, binary: Path, target: Path, *, mode: str = PLAIN, draft: Path | None = None,
                 threads: int = 2, context: int = 2048) -> None:
        self.port = _free_port()
        self.command = [str(binary), "-m", str(target), "-c", str(context), "-t", str(threads), "-tb", str(threads),
                        "-np", "1", "--host", "127.0.0.1", "--port", str(self.port), "--spec-type", mode]
        if draft is not None:
            self.command += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"edge-bench-llama-server-{self.port}.log"
        atexit.register(self.close)
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=self.log.open("w"))
        self._wait_until_ready(" ".join(self.command))

    def restart(self) -> None:
        """A fresh server process: nothing remembered from earlier requests."""
        self.close()
        self._start()

    def _wait_until_ready(self, command: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise EdgeError(f"llama-server exited while starting ({command}): {' / '.join(tail)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        self.close()
        raise EdgeError(f"llama-server did not answer within {START_TIMEOUT_S} s ({command}); see {self.log}")

    def greedy(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], dict]:
        """The greedy continuation of `prompt_ids` (at most `new_tokens`, ending at an end-of-generation token as
        edge does) and llama.cpp's draft counts for it."""
        body = json.dumps({"prompt": prompt_ids, "n_predict": new_tokens, "temperature": 0.0, "top_k": 1,
                           "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "cache_prompt": False,
                           "return_tokens": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as reply:
            answer = json.load(reply)
        timings = answer.get("timings", {})
        stats = {}
        if "draft_n" in timings:
            stats = {"drafted": timings["draft_n"], "accepted": timings.get("draft_n_accepted", 0)}
        return list(answer["tokens"]), stats

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
