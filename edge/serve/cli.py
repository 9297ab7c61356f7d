"""edge-serve: the OpenAI HTTP API on localhost, for any app that speaks it (editors, note apps, chat front-ends).

    edge-serve [MODEL_OR_BUNDLE]                     the default model when MODEL is omitted
    edge-serve MODEL --port 8080 --api-key KEY       clients send "Authorization: Bearer KEY"
    edge-serve --cors http://localhost:5173          a web page at that origin may call the API
    edge-serve --parallel 4                          4 replies generated together (default: as many as fit, up to 4)
    edge-serve --prompt-cache 1GiB                   keep more finished replies' keys/values for prompts that return
    edge-serve MODEL --ray HEAD:6379 --replicas 2    on a Ray cluster: replicas with one engine each (ray_cli.py)

The model, drafter, weights and memory options are edge-chat's (edge/frontend/options.py, one load spec); the sampling
flags set the defaults of requests that leave a field out. The server listens at once and loads in the background
(GET /health answers 503 until the model is ready).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import re
import sys
from pathlib import Path

from edge.frontend.options import (
    add_model_arguments,
    add_sampling_arguments,
    add_speculation_arguments,
    add_threads_argument,
    command_spec,
    model_options,
    generation_options,
)
from edge.memory.budget import BudgetError, parse_size
from edge.planning import plan
from edge.sources import default_model
from edge.engine import Engine
from edge.errors import EdgeError
from edge.serve.ray_cli import add_ray_arguments, cluster_options, serve_on_ray

try:  # the serve extra (FastAPI, uvicorn): without it edge-serve says how to install it
    import uvicorn

    from edge.serve.access import check_origin
    from edge.serve.app import ServeConfig, create_app
    from edge.serve.generation_queue import GenerationQueue
except ImportError as error:
    MISSING_PACKAGE: str | None = error.name or str(error)
else:
    MISSING_PACKAGE = None

API_KEY_VARIABLE = "EDGE_API_KEY"
DEFAULT_PORT = 8080  # llama-server's
GRACEFUL_S = 3  # on Ctrl+C or SIGTERM, how long connections may take to close (open replies end at once)
DEFAULT_PROMPT_CACHE = "256MiB"  # about 4,600 tokens of a 1.5B Qwen2.5's keys and values (float32)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-serve",
        description="Serve a local model over the OpenAI HTTP API (POST /v1/chat/completions, /v1/completions; "
        "GET /v1/models, /health). One model, several replies generated together (--parallel); the rest queue in "
        "arrival order.",
    )
    add_model_arguments(parser)
    add_threads_argument(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only); any other address lets "
                             "other machines in, so set an API key")
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default: {DEFAULT_PORT}")
    server.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="a name clients may reach the server by (the Host header), besides localhost, "
                             "127.0.0.1, [::1] and the --host address (any IP address when --host is 0.0.0.0 or ::); "
                             "other names are refused (421), which keeps web pages out through DNS rebinding; "
                             "repeatable")
    server.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                        help="let the web page at ORIGIN (scheme://host[:port]) call the API from a browser: its "
                             "preflights are answered and replies carry CORS headers; a request from any other page "
                             "(a browser adds an Origin header) is refused (403); repeatable")
    server.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: the "
                             f"{API_KEY_VARIABLE} environment variable; neither: no key)")
    add_slot_arguments(server)
    server.add_argument("--max-prompt-chars", type=int, default=None, metavar="N",
                        help="the longest prompt (a chat's messages, or a completion's text) in characters, checked "
                             "before it is tokenized; longer ones get 400 (default: 16 per token of the context); "
                             "a prompt must also fit the context in tokens")
    server.add_argument("--write-timeout", type=float, default=5.0, metavar="SECONDS",
                        help="a streamed reply whose client reads nothing for this long is cut off and its "
                             "generation stopped, so a stalled client cannot hold a generation slot "
                             "(default: 5)")
    server.add_argument("--model-name", default=None, metavar="NAME",
                        help="the model's id in /v1/models and in replies (default: the folder's name, or "
                             "edge-builtin); requests may name any model")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn's log level (default: info)")
    add_ray_arguments(parser)
    add_speculation_arguments(parser)
    add_sampling_arguments(parser, max_new_tokens=512)
    return parser


def add_slot_arguments(server) -> None:
    """--parallel, --prompt-cache and --queue-size: the replies generated together, what they keep, and who waits."""
    server.add_argument("--parallel", type=int, default=None, metavar="N",
                        help="slots: replies generated together, each request joining and leaving the running batch "
                             "at any step (one fused pass a step carries them all; each holds its own KV cache). A "
                             "reply speculates with its own copy of an ngram or retrieval drafter, and with a draft model a "
                             "greedy reply among others decodes plainly in a slot; a request with a response format "
                             "or a forced tool call, a sampled one a draft model speculates on, "
                             "and every request on a model without edge's fused CPU step, is generated on its own "
                             "beside them. Default: as many as the memory plan fits beside the model (--memory-budget, "
                             "else the free memory), up to 4; --plan shows it. 1: one reply at a time, each reusing "
                             "the KV cache of the conversation before it")
    server.add_argument("--prompt-cache", default=DEFAULT_PROMPT_CACHE, metavar="SIZE",
                        help="host memory for the keys and values a slot held before another request took it "
                             "(e.g. 512MiB; 0: none): a conversation's next turn, or a prompt asked again, starts "
                             "from them instead of being read again; the least recently used go first. Counted in "
                             f"the memory plan, and less where less is left (default: {DEFAULT_PROMPT_CACHE})")
    server.add_argument("--queue-size", type=int, default=16, metavar="N",
                        help="requests that may wait while every slot is busy; one more is answered 429 with a "
                             "Retry-After estimated from the measured tokens per second (default: 16)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if MISSING_PACKAGE is not None:
        print(f"edge-serve: error: {MISSING_PACKAGE} is not installed; install the server's packages with pip install "
              "'edge[serve]' (in a checkout: pip install -e '.[serve]')", file=sys.stderr)
        return 2
    try:
        config = serve_config(args)  # the server's own options first: a bad one is reported before the model is read
        cluster = cluster_options(args)
        spec = command_spec(args)
        if spec is None:  # --plan
            return 0
        # the flags over the model's recommended sampling: the defaults of the fields a request leaves out
        config = dataclasses.replace(config, defaults=model_options(args, spec))
        slots, prompt_cache = serve_slots(args, spec)
    except (EdgeError, ValueError) as error:
        print(f"edge-serve: error: {error}", file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        print(f"edge-serve: warning: listening on {args.host}, not only this machine: other machines can reach the "
              f"server{'' if config.api_key else '; set an API key (--api-key or ' + API_KEY_VARIABLE + ')'}",
              file=sys.stderr)
    if cluster is not None:
        return serve_on_ray(args, config, spec, cluster)
    generations = GenerationQueue(args.queue_size, slots, prompt_cache)
    server = StoppingServer(uvicorn.Config(create_app(config, generations), host=args.host, port=args.port,
                                           log_level=args.log_level, timeout_graceful_shutdown=GRACEFUL_S),
                            generations)

    def stop_server(error: BaseException) -> None:
        server.should_exit = True

    generations.start(lambda: loaded(spec), on_load_error=stop_server)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn raises the Ctrl+C it caught again once it has shut down
        generations.stop()
        return 130
    generations.stop()
    if generations.load_error is not None:
        print(f"edge-serve: error: {generations.load_error}", file=sys.stderr)
        return 2
    return 0


if MISSING_PACKAGE is None:
    class StoppingServer(uvicorn.Server):
        """uvicorn's server, which on SIGINT or SIGTERM first closes the generation queue: open replies end at once
        with an error event (streams) or a 503, instead of running on until uvicorn's graceful timeout cancels
        them."""

        def __init__(self, config: uvicorn.Config, generations: GenerationQueue) -> None:
            super().__init__(config)
            self.generations = generations

        def handle_exit(self, sig: int, frame) -> None:
            self.generations.close()
            super().handle_exit(sig, frame)


def loaded(spec) -> Engine:
    engine = Engine.from_spec(spec)
    for step in engine.plan.steps if engine.plan else ():
        logging.getLogger("serve").warning("memory plan: %s", step)
    return engine


def serve_slots(args: argparse.Namespace, spec) -> tuple[int, int]:
    """The slots and the bytes of their prompt cache: --parallel and --prompt-cache, or without --parallel as many
    slots as the memory plan fits; a budget asked for (--memory-budget) also caps the slots and the cache asked for.
    Without a budget, a model the planner cannot read runs one slot (said on stderr)."""
    asked = prompt_cache_bytes(args.prompt_cache)
    if args.parallel is not None and spec.memory_budget is None:
        return args.parallel, asked if args.parallel > 1 else 0
    try:
        chosen = plan(spec, slots=args.parallel, prompt_cache=asked)
        return chosen.slots, chosen.prompt_cache_bytes
    except EdgeError as error:
        if spec.memory_budget is not None:
            raise
        print(f"edge-serve: warning: one slot, as the memory planner cannot size more: {error}", file=sys.stderr)
        return 1, 0


def prompt_cache_bytes(size: str) -> int:
    """--prompt-cache in bytes: 0 (or 0 with a unit) for none."""
    if re.fullmatch(r"\s*0+(\.0*)?\s*([kmg]i?b?|b)?\s*", size, re.IGNORECASE):
        return 0
    try:
        return parse_size(size)
    except BudgetError as error:
        raise ValueError(f"--prompt-cache: {error}, or 0 for none") from None


def serve_config(args: argparse.Namespace) -> ServeConfig:
    if args.parallel is not None and args.parallel < 1:
        raise ValueError(f"--parallel must be at least 1, got {args.parallel}")
    args.prompt_cache_bytes = prompt_cache_bytes(args.prompt_cache)
    if args.queue_size < 1:
        raise ValueError(f"--queue-size must be at least 1, got {args.queue_size}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if not args.write_timeout > 0:
        raise ValueError(f"--write-timeout must be above 0 seconds, got {args.write_timeout}")
    if args.max_prompt_chars is not None and args.max_prompt_chars < 1:
        raise ValueError(f"--max-prompt-chars must be at least 1, got {args.max_prompt_chars}")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    name = args.model_name or model_id(args.model)
    defaults = generation_options(args)
    defaults.sampling  # noqa: B018 - checks the sampling flags now (SamplingError), not at the first request
    return ServeConfig(model_id=name, defaults=defaults, api_key=api_key,
                       speculate_when_sampling=args.drafter is not None, listen_host=args.host,
                       allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(check_origin(o) for o in args.cors),
                       max_prompt_chars=args.max_prompt_chars, write_timeout_s=args.write_timeout)


def model_id(model: str | None) -> str:
    """The name /v1/models lists: a folder's or file's name, a Hub id as given; for the default model its file's
    name, or edge-builtin for the built-in model."""
    if model is None:
        default = default_model.packaged_file()
        return default.stem if default is not None else "edge-builtin"
    path = Path(model)
    if path.is_file():
        return path.stem
    return path.resolve().name if path.is_dir() else model


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only "localhost" is known to stay on this machine
        return False


if __name__ == "__main__":
    sys.exit(main())
