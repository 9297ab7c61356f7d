"""How edge-serve runs on a Ray cluster (`--ray`): the replicas, their autoscaling, their CPUs, and the queue in
front of them. Checked from the command line by edge/serve/ray_cli.py, applied by edge/serve/ray_deploy.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterOptions:
    replicas: int = 1  # replicas to run; with max_replicas, the fewest autoscaling keeps
    max_replicas: int | None = None  # above `replicas`: autoscale between the two on the queue's length
    target_requests: float = 2.0  # requests per replica (generating and waiting) that autoscaling aims for
    replica_cpus: float = 1.0  # CPUs Ray reserves for each replica (where it places them)
    threads: int | None = None  # the engine's threads in each replica (None: torch's default)
    queue_size: int = 16  # requests that may wait for a replica; one more gets 429

    def scaling(self) -> dict:
        """Ray Serve's deployment options for the replica count: fixed, or autoscaling on ongoing requests (those
        generating, waiting at a replica and waiting in the gateway's queue)."""
        if self.max_replicas is None or self.max_replicas == self.replicas:
            return {"num_replicas": self.replicas}
        return {"autoscaling_config": {"min_replicas": self.replicas, "max_replicas": self.max_replicas,
                                       "target_ongoing_requests": self.target_requests}}
