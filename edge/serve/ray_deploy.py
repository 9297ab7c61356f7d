"""edge-serve as a Ray Serve application: replicas with one engine each behind one gateway, on a Ray cluster.

    Ray Serve's HTTP proxy ──> edge-gateway (no CPU) ──handle, streamed──> edge-engine × N (one engine each)

An `EngineReplica` loads the model in its own process and runs edge-serve's FastAPI app (edge/serve/app.py) on each
request forwarded to it (edge/serve/replica_link.py), so the OpenAI routes, limits, errors and metrics are
edge-serve's own. Ray Serve keeps REPLICA_REQUESTS requests at a replica (one generating, one ready to start) and
holds the rest in the gateway's queue (--queue-size; beyond it: 429), sending each to the first replica free; with
--max-replicas it adds replicas while that queue grows and removes them when it drains. Every HEALTH_CHECK_PERIOD_S
Ray asks each replica's GET /health in-process; a replica whose check fails or times out, or whose process dies,
is replaced. The gateway turns a reply cut off by a lost replica into an OpenAI-style error (a 503 with Retry-After,
or an error event and [DONE] in a stream), so no client waits on a reply that will not come.

Needs the cluster extra (pip install 'edge[cluster]'): this module imports Ray; edge/serve/ray_cli.py starts it.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import AsyncGenerator

import torch
from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
    RequestCancelledError,
)
from ray.serve.handle import DeploymentHandle

from edge.engine import Engine
from edge.load_spec import LoadSpec
from edge.serve.app import create_app
from edge.serve.cluster_options import ClusterOptions
from edge.serve.errors import ApiError
from edge.serve.generation_queue import GenerationQueue
from edge.serve.replica_link import ForwardedRequest, Message, ReplicaGateway, served
from edge.serve.state import ServeConfig

APPLICATION = "edge"  # the Ray Serve application's name (serve status, serve delete)
REPLICA_HEADER = b"x-edge-replica"  # every reply says which replica made it (its Ray Serve replica id)
REPLICA_REQUESTS = 2  # requests Ray Serve sends one replica at once: one generating, the next ready to start
HEALTH_CHECK_PERIOD_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 30.0
GATEWAY_REQUESTS = 1000  # open requests one gateway carries (each costs a coroutine, no CPU to speak of)


def build_application(spec: LoadSpec, config: ServeConfig, options: ClusterOptions):
    """The Ray Serve application (for serve.run): the gateway bound to the engine replicas."""
    engine = EngineReplica.options(
        **options.scaling(), max_ongoing_requests=REPLICA_REQUESTS, max_queued_requests=options.queue_size,
        ray_actor_options={"num_cpus": options.replica_cpus}, health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
    ).bind(spec, config, options.threads)
    return Gateway.bind(engine, config.max_body_bytes)


@serve.deployment(name="edge-engine")
class EngineReplica:
    """One engine, loaded when the replica starts (Ray routes nothing to it before), serving edge-serve's app."""

    async def __init__(self, spec: LoadSpec, config: ServeConfig, threads: int | None) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.generations = GenerationQueue(REPLICA_REQUESTS)
        self.generations.start(lambda: Engine.from_spec(spec))
        await asyncio.to_thread(self.generations.loaded.wait)
        if self.generations.engine is None:  # Ray Serve reports it (serve status) and tries a new replica
            raise RuntimeError(f"the model failed to load: {self.generations.load_error}")
        self.app = create_app(config, self.generations)
        self.replica_id = serve.get_replica_context().replica_id.unique_id.encode()

    async def serve_request(self, request: ForwardedRequest) -> AsyncGenerator[Message, None]:
        async for message in served(self.app, request):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (REPLICA_HEADER, self.replica_id)]}
            yield message

    async def check_health(self) -> None:
        """Ray Serve's health check: edge-serve's own GET /health, through the app, must answer 200."""
        probe = ForwardedRequest("GET", "/health", b"", ((b"host", b"localhost"),), b"")
        replies = [message async for message in served(self.app, probe)]
        status = next(message["status"] for message in replies if message["type"] == "http.response.start")
        if status != 200:
            body = b"".join(message.get("body", b"") for message in replies).decode(errors="replace")
            raise RuntimeError(f"GET /health answers {status}: {body}")

    def __del__(self) -> None:  # Ray Serve stops the replica: open replies end at once
        generations = getattr(self, "generations", None)
        if generations is not None:
            generations.close()
            generations.stop()


@serve.deployment(name="edge-gateway", max_ongoing_requests=GATEWAY_REQUESTS, ray_actor_options={"num_cpus": 0})
@serve.ingress()
class Gateway:
    """The HTTP side: Ray Serve's proxy hands it each request, which it forwards to an engine replica."""

    def __init__(self, engine: DeploymentHandle, max_body_bytes: int) -> None:
        self.engine = engine.options(method_name="serve_request", stream=True)
        self.max_body_bytes = max_body_bytes
        self.mean_reply_s = 1.0  # running mean of a reply's time, for Retry-After when the queue is full

    def __serve_build_asgi_app__(self) -> ReplicaGateway:
        return ReplicaGateway(self.forward, self.describe, self.max_body_bytes)

    async def forward(self, request: ForwardedRequest) -> AsyncGenerator[Message, None]:
        started, finished = time.monotonic(), False
        replies = self.engine.remote(request)
        try:
            async for message in replies:
                yield message
            finished = True
            self.mean_reply_s = 0.8 * self.mean_reply_s + 0.2 * (time.monotonic() - started)
        finally:
            if not finished:  # the client went away, or the replica failed: stop its generation
                replies.cancel()

    def describe(self, error: BaseException) -> ApiError:
        return failure_error(error, retry_after_s=max(1, math.ceil(self.mean_reply_s)))


def failure_error(error: BaseException, retry_after_s: int) -> ApiError:
    """What ended a forwarded request, as the client gets it."""
    if isinstance(error, BackPressureError):
        return ApiError(429, f"every replica is busy and the queue is full ({error}); retry in {retry_after_s} s",
                        kind="rate_limit_error", code="queue_full", headers={"Retry-After": str(retry_after_s)})
    if isinstance(error, (RayActorError, ReplicaUnavailableError)):
        return ApiError(503, "the replica making this reply stopped before finishing it (its process ended or its "
                        "node left the cluster); the other replicas go on serving and Ray Serve starts a new one: "
                        "retry", kind="unavailable_error", code="replica_lost", headers={"Retry-After": "1"})
    if isinstance(error, DeploymentUnavailableError):
        return ApiError(503, f"no replica is running: {error.message} (see `serve status`)",
                        kind="unavailable_error", code="no_replica", headers={"Retry-After": "5"})
    if isinstance(error, RequestCancelledError):
        return ApiError(503, "the request was cancelled in the cluster", kind="unavailable_error", code="cancelled")
    cause = error.cause if isinstance(error, RayTaskError) and error.cause is not None else error  # not the traceback
    return ApiError(500, f"a replica failed to make this reply ({type(cause).__name__}: {cause}); see the replica's "
                    "log (serve status, ray logs)", kind="server_error")
