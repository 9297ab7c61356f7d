"""Load test of edge-serve: concurrent clients against a server on loopback for a fixed time, every reply checked.

    flock /tmp/edge-bench.lock python -m bench.serve_load --clients 8 --duration 60
    flock /tmp/edge-bench.lock python -m bench.serve_load --clients 4 --parallel 4    # 4 replies generated together

Starts `edge-serve` (the default model with its default drafter, or MODEL) in its own process, computes each
request's greedy reference with `Engine.chat` / `Engine.generate` (plain decoding) here, then runs the clients:
each sends chat and text completions, whole and streamed, in turn, and on a 429 waits the Retry-After it was given
and sends again. It reports requests/s, generated tokens/s, end-to-end latency (queue wait and retries included)
at p50/p95, time to the first streamed token, the 429s, and the server's resident memory after a warm-up, every
--rss-every seconds of the run and at the end. It fails (exit 1) when a reply is incomplete or differs from its reference, or on any error but a 429.

    flock /tmp/edge-bench.lock python -m bench.serve_load --clients 8 --duration 60 --adversaries

    python -m bench.serve_load MODEL.gguf --clients 4 --parallel 4 --threads 2 \
        --llama-server PATH/llama-server --llama-server-args "-md DRAFT.gguf --draft-max 8"

With --llama-server the same clients run against llama.cpp's server on the same file (--parallel slots, continuous
batching, its --threads, and any further flags of its own), instead of edge-serve: replies are checked for being
whole (a finish reason, the stream's [DONE]) but not against edge's references (its arithmetic differs), and the
count of replies equal to them is reported (`equal_to_edge`).

With --adversaries the clients run twice: alone (the quiet run), then beside a slow reader (streamed chats read one
event per --slow-pause seconds) and a sender of 10 MB messages (each must be refused, 400 string_above_max_length).
It then also reports, and fails unless: no normal client's reply was lost, every reply equals its greedy
reference, the normal clients' p95 latency is within 2x of the quiet run's, and the server's resident memory stays
flat (grows by at most --rss-slack MiB from the start of the quiet run to the end).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import psutil

from bench.arguments import bench_parser
from bench.prompts import PROMPTS
from edge.sources.default_model import default_model_path
from edge.engine import Engine

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


@dataclass(frozen=True)
class Request:
    path: str
    body: dict
    expected: str  # the reply's text from Engine.chat / Engine.generate, greedy
    compare: bool = True  # a reply that differs from `expected` is a problem (not for a peer's server)


@dataclass(frozen=True)
class Outcome:
    latency_s: float  # from the first send to the last byte, 429 waits included
    first_token_s: float | None  # streamed replies: until the first text
    tokens: int
    rejected: int  # 429s before it was taken
    problem: str | None  # an error, an incomplete reply or a reply that differs from its reference
    equal: bool = False  # the reply's text equals its greedy reference


def workload(engine: Engine, max_tokens: int) -> list[Request]:
    """Each prompt of edge-bench's set as a chat (whole, then streamed on alternate prompts) and its last message as
    a text completion; greedy references computed here."""
    requests = []
    for index, prompt in enumerate(PROMPTS):
        stream = index % 2 == 1
        chat = {"model": "edge", "messages": prompt.messages, "max_tokens": max_tokens, "temperature": 0}
        expected = "".join(event.text for event in engine.chat(prompt.messages, max_new_tokens=max_tokens, temperature=0.0))
        requests.append(Request(CHAT, {**chat, "stream": stream}, expected))
        text = prompt.messages[-1]["content"]
        completion = {"model": "edge", "prompt": text, "max_tokens": max_tokens, "temperature": 0}
        expected = "".join(event.text for event in engine.generate(text, max_new_tokens=max_tokens, temperature=0.0))
        requests.append(Request(TEXT, {**completion, "stream": not stream}, expected))
    return requests


def cached_workload(args: argparse.Namespace) -> list[Request]:
    """The workload, its greedy references read from --references where that file holds them for this model and
    --max-tokens (computing them takes minutes on a 1B model), else computed and written there."""
    model = str(args.model or default_model_path())
    key = {"model": model, "max_tokens": args.max_tokens, "prompts": [prompt.messages for prompt in PROMPTS]}
    if args.references and os.path.exists(args.references):
        with open(args.references) as handle:
            stored = json.load(handle)
        if stored.get("key") == key:
            return [Request(item["path"], item["body"], item["expected"]) for item in stored["requests"]]
    requests = workload(Engine.load(model), args.max_tokens)
    if args.references:
        with open(args.references, "w") as handle:
            json.dump({"key": key, "requests": [dataclasses.asdict(request) for request in requests]}, handle)
    return requests


def send(client: httpx.Client, request: Request) -> Outcome:
    started, rejected = time.perf_counter(), 0
    while True:
        try:
            if request.body["stream"]:
                body = {**request.body, "stream_options": {"include_usage": True}}
                with client.stream("POST", request.path, json=body) as response:
                    if response.status_code == 200:
                        return streamed_outcome(response, request, started, rejected)
                    response.read()
            else:
                response = client.post(request.path, json=request.body)
                if response.status_code == 200:
                    return whole_outcome(response.json(), request, started, rejected)
        except (httpx.HTTPError, ValueError, KeyError) as error:
            return Outcome(time.perf_counter() - started, None, 0, rejected, f"{type(error).__name__}: {error}")
        if response.status_code != 429:
            return Outcome(time.perf_counter() - started, None, 0, rejected,
                           f"HTTP {response.status_code}: {response.text[:200]}")
        rejected += 1
        time.sleep(float(response.headers.get("Retry-After", "1")))


def whole_outcome(reply: dict, request: Request, started: float, rejected: int) -> Outcome:
    choice = reply["choices"][0]
    text = choice["message"]["content"] if request.path == CHAT else choice["text"]
    return Outcome(time.perf_counter() - started, None, reply["usage"]["completion_tokens"], rejected,
                   checked(text, choice["finish_reason"], request), text == request.expected)


def streamed_outcome(response: httpx.Response, request: Request, started: float, rejected: int) -> Outcome:
    parts, first_token_s, finish, tokens, done = [], None, None, 0, False
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        chunk = json.loads(line.removeprefix("data: "))
        if "error" in chunk:
            return Outcome(time.perf_counter() - started, None, 0, rejected, f"stream error: {chunk['error']}")
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk["choices"]:
            text = (choice["delta"].get("content") or "") if request.path == CHAT else choice["text"]
            if text and first_token_s is None:
                first_token_s = time.perf_counter() - started
            parts.append(text)
            finish = choice["finish_reason"] or finish
    text = "".join(parts)
    problem = checked(text, finish, request) if done else "the stream ended before [DONE]"
    return Outcome(time.perf_counter() - started, first_token_s, tokens, rejected, problem, text == request.expected)


def checked(text: str, finish: str | None, request: Request) -> str | None:
    if finish not in ("stop", "length"):
        return f"incomplete reply (finish_reason {finish!r})"
    if request.compare and text != request.expected:
        return f"differs from its greedy reference: {text[:60]!r} != {request.expected[:60]!r}"
    return None


def run_clients(url: str, requests: list[Request], clients: int, duration_s: float) -> list[Outcome]:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + duration_s

    def client_loop(offset: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            turn = offset
            while time.perf_counter() < deadline:
                outcome = send(client, requests[turn % len(requests)])
                with lock:
                    outcomes.append(outcome)
                turn += 1

    threads = [threading.Thread(target=client_loop, args=(index * len(requests) // clients,))
               for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def slow_reader(url: str, request: Request, deadline: float, pause_s: float) -> list[Outcome]:
    """Streamed chats read one server-sent event per `pause_s`: a reply is complete and equal to its reference, or
    cut off by the server's --write-timeout (a problem starting "cut off")."""
    outcomes = []
    with httpx.Client(base_url=url, timeout=300) as client:
        while time.perf_counter() < deadline:
            started, parts, finish, done = time.perf_counter(), [], None, False
            try:
                with client.stream("POST", CHAT, json={**request.body, "stream": True}) as response:
                    if response.status_code == 429:
                        response.read()
                        time.sleep(float(response.headers.get("Retry-After", "1")))
                        continue
                    for line in response.iter_lines():
                        time.sleep(pause_s)
                        if line == "data: [DONE]":
                            done = True
                            break
                        if line.startswith("data: "):
                            chunk = json.loads(line.removeprefix("data: "))
                            for choice in chunk.get("choices", []):
                                parts.append(choice["delta"].get("content") or "")
                                finish = choice["finish_reason"] or finish
                problem = checked("".join(parts), finish, request) if done else "cut off before [DONE]"
            except httpx.HTTPError as error:
                problem = f"cut off: {type(error).__name__}"
            outcomes.append(Outcome(time.perf_counter() - started, None, 0, 0, problem))
    return outcomes


def big_sender(url: str, deadline: float, size: int = 10 * 2**20) -> list[Outcome]:
    """Chats whose one message is `size` characters: each must be refused at once (400 string_above_max_length)."""
    body = {"model": "edge", "messages": [{"role": "user", "content": "word " * (size // 5)}], "max_tokens": 8}
    outcomes = []
    with httpx.Client(base_url=url, timeout=300) as client:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                response = client.post(CHAT, json=body)
                code = response.json().get("error", {}).get("code") if response.status_code == 400 else None
                problem = None if code == "string_above_max_length" else f"HTTP {response.status_code}, not refused"
            except (httpx.HTTPError, ValueError) as error:
                problem = f"{type(error).__name__}: {error}"
            outcomes.append(Outcome(time.perf_counter() - started, None, 0, 0, problem))
    return outcomes


def noisy_run(url: str, requests: list[Request], args: argparse.Namespace) -> tuple[list[Outcome], dict]:
    """The normal clients beside a slow reader and a 10 MB sender: their outcomes, and the adversaries' figures."""
    deadline = time.perf_counter() + args.duration
    slow, big = [], []
    chat = next(request for request in requests if request.path == CHAT)
    adversaries = [threading.Thread(target=lambda: slow.extend(slow_reader(url, chat, deadline, args.slow_pause))),
                   threading.Thread(target=lambda: big.extend(big_sender(url, deadline)))]
    for thread in adversaries:
        thread.start()
    outcomes = run_clients(url, requests, args.clients, args.duration)
    for thread in adversaries:
        thread.join()
    cut = [outcome for outcome in slow if outcome.problem and outcome.problem.startswith("cut off")]
    return outcomes, {
        "slow_replies": len(slow), "slow_cut_off": len(cut),
        "slow_wrong": sum(1 for outcome in slow if outcome.problem and outcome not in cut),
        "big_messages": len(big), "big_not_refused": sum(1 for outcome in big if outcome.problem),
        "big_latency_p95_s": percentile([outcome.latency_s for outcome in big], 0.95),
        "problems": [outcome.problem for outcome in slow + big if outcome.problem and outcome not in cut],
    }


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:  # a free port, handed to the server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if args.llama_server:
        if not args.model:
            raise SystemExit("serve_load: --llama-server needs the MODEL file both servers run")
        slots = args.parallel or 1
        command = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                   "-np", str(slots), "-c", str(slots * args.slot_context), "-t", str(args.threads),
                   *(["--no-cache-prompt"] if args.no_prompt_cache else []), "--log-disable",
                   *shlex.split(args.llama_server_args)]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return server, _ready(server, f"http://127.0.0.1:{port}")
    command = [sys.executable, "-m", "edge.serve.cli", *([args.model] if args.model else []), "--port", str(port),
               "--queue-size", str(args.queue_size), "--threads", str(args.threads), "--log-level", "warning",
               *(["--parallel", str(args.parallel)] if args.parallel else []),
               *(["--drafter", args.drafter] if args.drafter else []),
               *(["--prompt-cache", "0"] if args.no_prompt_cache else [])]
    server = subprocess.Popen(command)
    return server, _ready(server, f"http://127.0.0.1:{port}")


def _ready(server: subprocess.Popen, url: str) -> str:
    """`url` once the server answers /health with 200 (llama-server: once its model is loaded)."""
    deadline = time.monotonic() + 300
    while True:
        if server.poll() is not None:
            raise SystemExit(f"serve_load: the server exited with {server.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise SystemExit("serve_load: the server did not become ready in 300 s")
        time.sleep(0.2)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


class RssSamples:
    """The server's resident memory every `every_s` seconds while the clients run (a thread): whether it levels off
    or keeps rising."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.pid, self.every_s, self.mib = pid, every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.mib.append(round(rss_mib(self.pid), 1))

    def __enter__(self) -> "RssSamples":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def summary(outcomes: list[Outcome], duration_s: float, rss_start: float, rss_end: float,
            args: argparse.Namespace) -> dict:
    served = [outcome for outcome in outcomes if outcome.problem is None]
    first_tokens = [outcome.first_token_s for outcome in served if outcome.first_token_s is not None]
    first_try = [outcome.latency_s for outcome in served if not outcome.rejected]
    return {
        "clients": args.clients, "parallel": args.parallel, "duration_s": duration_s, "queue_size": args.queue_size,
        "threads": args.threads,
        "max_tokens": args.max_tokens, "requests": len(outcomes), "served": len(served),
        "problems": len(outcomes) - len(served), "rejected_429": sum(outcome.rejected for outcome in outcomes),
        "requests_per_s": len(served) / duration_s,
        "tokens_per_s": sum(outcome.tokens for outcome in served) / duration_s,
        "latency_p50_s": percentile([outcome.latency_s for outcome in served], 0.50),
        "latency_p95_s": percentile([outcome.latency_s for outcome in served], 0.95),
        "first_token_p50_s": statistics.median(first_tokens) if first_tokens else 0.0,
        # taken at the first try: queue wait and generation only, no 429 back-off
        "first_try_latency_p50_s": percentile(first_try, 0.50),
        "first_try_latency_p95_s": percentile(first_try, 0.95),
        "rss_start_mib": rss_start, "rss_end_mib": rss_end,
        "equal_to_edge": sum(outcome.equal for outcome in served),
        "server": "llama-server" if args.llama_server else "edge-serve",
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.serve_load", __doc__, model="what edge-serve runs (default: its default model)",
        drafter={"help": "edge-serve's --drafter (default: its own default)"},
        threads={"default": 1, "help": "edge-serve's --threads (default: 1, leaving the other cores to the clients)"},
        json={"help": "also write the figures to this file"})
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default: 60)")
    parser.add_argument("--queue-size", type=int, default=4,
                        help="edge-serve's --queue-size; below the clients, some requests get 429s (default: 4)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=None,
                        help="edge-serve's --parallel: replies generated together (default: its own, from the memory "
                             "plan)")
    parser.add_argument("--adversaries", action="store_true",
                        help="a quiet run, then one beside a slow reader and a 10 MB message sender (see above)")
    parser.add_argument("--slow-pause", type=float, default=0.2,
                        help="the slow reader's pause per server-sent event, in seconds (default: 0.2)")
    parser.add_argument("--rss-slack", type=float, default=64.0,
                        help="MiB the server's memory may grow across the runs and still count as flat (default: 64)")
    parser.add_argument("--rss-every", type=float, default=30.0,
                        help="seconds between samples of the server's resident memory during the run (default: 30)")
    parser.add_argument("--references", default=None, metavar="FILE",
                        help="keep the greedy references in this JSON file and reuse them while the model and "
                             "--max-tokens are the same")
    parser.add_argument("--llama-server", default=None, metavar="PATH",
                        help="run the clients against this llama-server on MODEL instead of edge-serve (see above)")
    parser.add_argument("--llama-server-args", default="", metavar="FLAGS",
                        help="more flags for llama-server, e.g. its speculation: '-md DRAFT.gguf --draft-max 8'")
    parser.add_argument("--slot-context", type=int, default=4096,
                        help="llama-server's context per slot (its -c is this times --parallel; default: 4096)")
    parser.add_argument("--no-prompt-cache", action="store_true",
                        help="no prompt cache: llama-server's --no-cache-prompt, edge-serve's --prompt-cache 0 (each "
                             "slot still starts from what it holds); default: both keep earlier prompts")
    args = parser.parse_args(argv)

    print("serve_load: greedy references ...", file=sys.stderr)
    # edge-serve with no MODEL runs the default model (the built-in one where it is not installed): so do these
    requests = cached_workload(args)
    if args.llama_server:
        requests = [dataclasses.replace(request, compare=False) for request in requests]
    server, url = start_server(args)
    try:
        with httpx.Client(base_url=url, timeout=300) as client:  # warm-up: every request once
            warm = [send(client, request) for request in requests]
        rss_start = rss_mib(server.pid)
        print(f"serve_load: {args.clients} clients for {args.duration:.0f} s ...", file=sys.stderr)
        started = time.perf_counter()
        with RssSamples(server.pid, every_s=args.rss_every) as rss_samples:
            outcomes = run_clients(url, requests, args.clients, args.duration)
        duration_s = time.perf_counter() - started
        rss_end = rss_mib(server.pid)
        noisy = None
        if args.adversaries:
            print("serve_load: again, beside a slow reader and 10 MB messages ...", file=sys.stderr)
            started = time.perf_counter()
            noisy_outcomes, adversaries = noisy_run(url, requests, args)
            noisy = summary(noisy_outcomes, time.perf_counter() - started, rss_end, rss_mib(server.pid), args)
    finally:
        server.terminate()
        server.wait(timeout=60)
    figures = {**summary(outcomes, duration_s, rss_start, rss_end, args), "rss_samples_mib": rss_samples.mib}
    problems = [outcome.problem for outcome in warm + outcomes if outcome.problem is not None]
    if noisy is not None:
        problems += [outcome.problem for outcome in noisy_outcomes if outcome.problem is not None]
        problems += adversaries.pop("problems")
        ratio = noisy["latency_p95_s"] / figures["latency_p95_s"] if figures["latency_p95_s"] else float("inf")
        rss_growth = noisy["rss_end_mib"] - rss_start
        checks = {"no_reply_lost": noisy["problems"] == 0 and figures["problems"] == 0,
                  "replies_equal_greedy": not problems, "p95_within_2x": ratio <= 2.0,
                  "rss_flat": rss_growth <= args.rss_slack}
        figures = {"quiet": figures, "noisy": {**noisy, **adversaries}, "p95_ratio": ratio,
                   "rss_growth_mib": rss_growth, "checks": checks}
        problems += [f"check failed: {name}" for name, passed in checks.items() if not passed]
    for problem in sorted(set(problems))[:10]:
        print(f"serve_load: problem: {problem}", file=sys.stderr)
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
