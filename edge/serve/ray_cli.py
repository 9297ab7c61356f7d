"""`edge-serve --ray ADDRESS --replicas N`: the same server on a Ray cluster, as replicas with one engine each.

    ray start --head --port 6379                        on the head node (then `ray start --address HEAD:6379`
                                                        on each other node)
    edge-serve MODEL --ray HEAD:6379 --replicas 2       on the head node: http://127.0.0.1:8080/v1, as edge-serve
    edge-serve MODEL --ray auto --replicas 1 --max-replicas 4    autoscaling on the queue's length

The flags checked here need no Ray; `serve_on_ray` imports it (the cluster extra) and runs the application
edge/serve/ray_deploy.py builds until Ctrl+C or SIGTERM, which removes it from the cluster.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING

from edge.serve.cluster_options import ClusterOptions

if TYPE_CHECKING:  # the serve extra's: the flags are read before edge-serve checks it is installed
    from edge.load_spec import LoadSpec
    from edge.serve.state import ServeConfig

INSTALL = "pip install 'edge[cluster]' (in a checkout: pip install -e '.[cluster]')"


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(f"cluster (Ray Serve; needs {INSTALL})")
    group.add_argument("--ray", default=None, metavar="ADDRESS",
                       help="serve on the Ray cluster at ADDRESS (its head's host:port, or 'auto' for the cluster "
                            "this node belongs to): replicas with one engine each, behind one HTTP address "
                            "(--host, --port) on the head node; the model must be at the same path on every node")
    group.add_argument("--replicas", type=int, default=None, metavar="N",
                       help="replicas, each loading the model in its own process (default: 1); a replica that dies "
                            "is replaced and its open replies end with an error")
    group.add_argument("--max-replicas", type=int, default=None, metavar="N",
                       help="add replicas up to N while requests wait, and remove them down to --replicas when the "
                            "queue drains (default: a fixed --replicas)")
    group.add_argument("--replica-cpus", type=float, default=None, metavar="N",
                       help="CPUs Ray reserves for each replica, which decides how many share a node (default: "
                            "--threads, else 1)")


def cluster_options(args: argparse.Namespace) -> ClusterOptions | None:
    """The --ray flags, checked (ValueError naming the fix); None without --ray."""
    if args.ray is None:
        given = [flag for flag, value in (("--replicas", args.replicas), ("--max-replicas", args.max_replicas),
                                          ("--replica-cpus", args.replica_cpus)) if value is not None]
        if given:
            raise ValueError(f"{given[0]} runs replicas on a Ray cluster: add --ray ADDRESS (e.g. --ray auto)")
        return None
    replicas = 1 if args.replicas is None else args.replicas
    if replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {replicas}")
    if args.max_replicas is not None and args.max_replicas < replicas:
        raise ValueError(f"--max-replicas must be at least --replicas ({replicas}), got {args.max_replicas}")
    cpus = args.replica_cpus if args.replica_cpus is not None else float(args.threads or 1)
    if not cpus >= 0:
        raise ValueError(f"--replica-cpus must be 0 or more, got {args.replica_cpus}")
    return ClusterOptions(replicas=replicas, max_replicas=args.max_replicas, replica_cpus=cpus,
                          threads=args.threads, queue_size=args.queue_size)


def serve_on_ray(args: argparse.Namespace, config: ServeConfig, spec: LoadSpec,
                 options: ClusterOptions) -> int:
    """Deploy on the cluster, wait for the replicas to load, serve until Ctrl+C or SIGTERM, then remove the
    application."""
    try:
        import ray
        from ray import serve

        from edge.serve.ray_deploy import APPLICATION, build_application
    except ImportError as error:
        print(f"edge-serve: error: --ray needs Ray Serve, and {error.name or error} is not installed; install it with "
              f"{INSTALL}", file=sys.stderr)
        return 2
    try:
        if not answers(args.ray):  # Ray itself would wait minutes on an address nobody listens at
            raise ConnectionError("nothing listens there")
        ray.init(address=args.ray, logging_level="warning")
    except ConnectionError as error:
        print(f"edge-serve: error: no Ray cluster at {args.ray} ({error}); start one with `ray start --head` and "
              "pass the address it prints", file=sys.stderr)
        return 2
    try:
        serve.start(http_options={"host": args.host, "port": args.port}, proxy_location="HeadOnly")
        serve.run(build_application(spec, config, options), name=APPLICATION, route_prefix="/")
        scaling = (f"{options.replicas} replica{'s' * (options.replicas > 1)}" if options.max_replicas is None
                   else f"{options.replicas} to {options.max_replicas} replicas")
        print(f"edge-serve: {config.model_id}, {scaling} on the Ray cluster at {args.ray}: "
              f"http://{args.host}:{args.port}/v1 (Ctrl+C stops)", file=sys.stderr)
        wait_for_stop()
        return 0
    except RuntimeError as error:  # serve.run: the application failed to deploy (a replica failed to load)
        print(f"edge-serve: error: {error}", file=sys.stderr)
        return 2
    finally:
        serve.delete(APPLICATION)
        ray.shutdown()


def answers(address: str, timeout_s: float = 5.0) -> bool:
    """Whether something accepts a connection at a host:port address; True for any other form ('auto', ray://),
    which Ray resolves itself."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or "://" in address:
        return True
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_stop() -> None:
    """Until Ctrl+C or SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
