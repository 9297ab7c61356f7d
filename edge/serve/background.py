"""edge-serve's app under uvicorn in a background thread, on a free loopback port: what the tests and the load test
run.

    with BackgroundServer(lambda: Engine.load(path), ServeConfig("my-model")) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none")
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import uvicorn

from edge.engine import Engine
from edge.serve.app import ServeConfig, create_app
from edge.serve.generation_queue import GenerationQueue


class BackgroundServer:
    """`load` runs in the generation thread once the server is up (GET /health answers 503 until it returns);
    `parallel` replies are generated together (edge-serve's --parallel), with a prompt cache of `prompt_cache` bytes
    (--prompt-cache)."""

    def __init__(self, load: Callable[[], Engine], config: ServeConfig, *, queue_size: int = 16, parallel: int = 1,
                 prompt_cache: int = 0, host: str = "127.0.0.1", log_level: str = "warning") -> None:
        self._load = load
        self.generations = GenerationQueue(queue_size, parallel, prompt_cache)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))  # the OS picks a free port, known before the server starts
        self.host, self.port = self._socket.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn.Config(create_app(config, self.generations), log_level=log_level,
                                                   timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]},
                                        name="edge-serve-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        self.generations.start(self._load)
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info) -> None:
        self.generations.close()  # as edge-serve on Ctrl+C: open replies end with an error
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()
        self.generations.stop()
