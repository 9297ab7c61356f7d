"""`edge-serve MODEL --ray ADDRESS --replicas 2` on a two-node Ray cluster, both nodes on the loopback: two replicas of
the built-in model, one per node, under a load of streamed and whole requests; one replica's process is killed
mid-load. Every request either answers or ends with a clear error (never a hang or a cut-off reply), the load goes on
on the other replica, Ray Serve replaces the dead one, and Ctrl+C takes the application off the cluster. Needs the
cluster extra (pip install -e '.[cluster]'); skipped without it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

ray = pytest.importorskip("ray", reason="the cluster extra is not installed (pip install -e '.[cluster]')")
serve = pytest.importorskip("ray.serve", reason="the cluster extra is not installed (pip install -e '.[cluster]')")

from edge.serve.ray_deploy import APPLICATION  # noqa: E402
from edge.sources.builtin import builtin_model_path  # noqa: E402
from tests.helpers import sigint_as_from_a_terminal  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster and three model loads: about a minute on 2 cores

REQUEST_TIMEOUT_S = 60  # a request silent this long has hung: the test fails
CLIENTS = 6  # concurrent clients, half streaming: each replica has one generating and one waiting, more queued
TOKENS = 300  # long enough that a kill lands in the middle of replies
ENGINE_REPLICA = "#edge-engine#"  # in a replica actor's name: SERVE_REPLICA::edge#edge-engine#<replica id>


@dataclass(frozen=True)
class Outcome:
    kind: str  # "answered", "error" (an OpenAI-style error body or event) or "broken" (anything else)
    replica: str | None  # the x-edge-replica header
    detail: str = ""  # the error's code, or what was broken
    ended_at: float = 0.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)  # the worker node: with one CPU each, one replica lands on each node
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
    try:
        yield cluster
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory) -> str:
    """`edge-serve --ray ADDRESS --replicas 2`, as documented, on the built-in model; stopped with Ctrl+C."""
    port, log = free_port(), tmp_path_factory.mktemp("edge-serve") / "stderr.txt"
    command = [sys.executable, "-m", "edge.serve.cli", str(builtin_model_path()), "--ray", cluster.address,
               "--replicas", "2", "--threads", "1", "--port", str(port)]
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=sigint_as_from_a_terminal)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_replies(url, process, log)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0, log.read_text()
    assert APPLICATION not in serve.status().applications  # Ctrl+C took the application off the cluster


def wait_for_replies(url: str, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 180
    while True:
        assert process.poll() is None, f"edge-serve --ray exited: {log.read_text()}"
        assert time.monotonic() < deadline, f"edge-serve --ray did not answer: {log.read_text()}"
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def engine_replicas() -> dict[str, object]:
    """The engine replicas' actors by replica id."""
    return {entry["name"].rpartition("#")[2]: ray.get_actor(entry["name"], namespace=entry["namespace"])
            for entry in ray.util.list_named_actors(all_namespaces=True) if ENGINE_REPLICA in entry["name"]}


def process_id(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda replica: os.getpid()), timeout=30)


def request(client: httpx.Client, stream: bool, on_start=None) -> Outcome:
    body = {"model": "edge", "prompt": "The cache", "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    try:
        with client.stream("POST", "/v1/completions", json=body) as response:
            replica = response.headers.get("x-edge-replica")
            if response.status_code != 200:
                code = json.loads(response.read())["error"]["code"]
                return Outcome("error", replica, f"{response.status_code} {code}", time.monotonic())
            if not stream:
                reply = json.loads(response.read())
                finished = reply["choices"][0]["finish_reason"] == "length"
                return Outcome("answered" if finished else "broken", replica, json.dumps(reply)[:200], time.monotonic())
            return streamed_outcome(response, replica, on_start)
    except httpx.HTTPError as error:  # a cut-off reply, a refused connection, a hang (the read timeout)
        return Outcome("broken", None, repr(error), time.monotonic())


def streamed_outcome(response: httpx.Response, replica: str | None, on_start) -> Outcome:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(line[len("data: "):])
            if len(events) == 1 and on_start is not None:
                on_start(replica)
    if not events or events[-1] != "[DONE]":
        return Outcome("broken", replica, f"no [DONE]: {events[-2:]}", time.monotonic())
    last = json.loads(events[-2])
    if "error" in last:
        return Outcome("error", replica, f"stream {last['error']['code']}", time.monotonic())
    finished = last["choices"][0]["finish_reason"] == "length"
    return Outcome("answered" if finished else "broken", replica, events[-2][:200], time.monotonic())


class Load:
    """CLIENTS threads sending requests back to back until stopped; `streaming` maps a replica id to its streams
    under way."""

    def __init__(self, url: str) -> None:
        self.url, self.outcomes, self.stop = url, [], threading.Event()
        self.streaming: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(index % 2 == 0,), daemon=True)
                        for index in range(CLIENTS)]

    def client(self, stream: bool) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as client:
            while not self.stop.is_set():
                holder: list[str] = []

                def on_start(replica: str | None) -> None:
                    with self.lock:
                        holder.append(replica)
                        self.streaming[replica] = self.streaming.get(replica, 0) + 1

                outcome = request(client, stream, on_start=on_start)
                with self.lock:
                    for replica in holder:
                        self.streaming[replica] -= 1
                    self.outcomes.append(outcome)

    def wait_until(self, condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}; outcomes: {self.outcomes}"
            time.sleep(0.02)

    def __enter__(self) -> "Load":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(REQUEST_TIMEOUT_S + 5)
        assert not any(thread.is_alive() for thread in self.threads), "a client hung"


def test_a_killed_replica_ends_its_requests_with_an_error_and_the_load_goes_on_and_is_replaced(server):
    replicas = {replica: process_id(actor) for replica, actor in engine_replicas().items()}
    assert len(replicas) == 2
    with Load(server) as load:
        victim = None

        def a_stream_under_way() -> bool:
            nonlocal victim
            with load.lock:
                victim = next((replica for replica, count in load.streaming.items() if count > 0), None)
            return victim is not None

        load.wait_until(a_stream_under_way, 120, "a stream to start")
        os.kill(replicas[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        load.wait_until(lambda: sum(outcome.kind == "answered" and outcome.ended_at > killed_at + 1
                                    for outcome in load.outcomes) >= 4, 120, "replies after the kill")
    outcomes = load.outcomes
    assert [outcome for outcome in outcomes if outcome.kind == "broken"] == []
    errors = [outcome for outcome in outcomes if outcome.kind == "error"]
    assert errors and all("replica_lost" in outcome.detail for outcome in errors), errors
    assert any(outcome.detail.startswith("stream") for outcome in errors)  # the stream cut by the kill, ended clearly
    after = [outcome for outcome in outcomes if outcome.kind == "answered" and outcome.ended_at > killed_at + 1]
    survivor = next(replica for replica in replicas if replica != victim)
    assert any(outcome.replica == survivor for outcome in after)
    assert victim not in {outcome.replica for outcome in after}
    assert_replaced(server, victim)


def assert_replaced(url: str, victim: str) -> None:
    """Ray Serve starts a new replica in the dead one's place, and it serves."""
    deadline = time.monotonic() + 120
    while True:  # Serve's status and the named actors' list can each say so a moment before the other
        status = serve.status().applications[APPLICATION].deployments["edge-engine"]
        replicas = set(engine_replicas())
        if status.status == "HEALTHY" and status.replica_states.get("RUNNING") == 2 and len(replicas) == 2 \
                and victim not in replicas:
            break
        assert time.monotonic() < deadline, f"no new replica: {status}, named replicas {sorted(replicas)}"
        time.sleep(0.5)
    with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        outcomes = [request(client, stream=False) for _ in range(6)]
    assert {outcome.kind for outcome in outcomes} == {"answered"} and {o.replica for o in outcomes} <= replicas
