"""What the gateway tells a client when Ray Serve could not finish its request, and the replica options Ray Serve
is given. Needs the cluster extra (pip install -e '.[cluster]'); skipped without it."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="the cluster extra is not installed (pip install -e '.[cluster]')")

from ray.exceptions import ActorDiedError, RayTaskError  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402

from edge.serve.cluster_options import ClusterOptions  # noqa: E402
from edge.serve.ray_deploy import EngineReplica, failure_error  # noqa: E402


def test_a_lost_replica_is_a_503_the_client_may_retry():
    error = failure_error(ActorDiedError(), retry_after_s=3)
    assert (error.status, error.code, error.headers) == (503, "replica_lost", {"Retry-After": "1"})
    assert "retry" in error.message


def test_a_full_queue_is_a_429_with_retry_after():
    error = failure_error(BackPressureError(num_queued_requests=16, max_queued_requests=16), retry_after_s=3)
    assert (error.status, error.kind, error.code, error.headers) == (429, "rate_limit_error", "queue_full",
                                                                     {"Retry-After": "3"})


def test_a_replicas_own_failure_names_its_cause_not_its_traceback():
    error = failure_error(RayTaskError("serve_request", "Traceback (most recent call last): ...",
                                       RuntimeError("the app ended without finishing its reply")), retry_after_s=1)
    assert error.status == 500
    assert "RuntimeError: the app ended without finishing its reply" in error.message
    assert "Traceback" not in error.message


@pytest.mark.parametrize("options, expected", [
    (ClusterOptions(replicas=2), {"num_replicas": 2}),
    (ClusterOptions(replicas=2, max_replicas=2), {"num_replicas": 2}),
    (ClusterOptions(replicas=1, max_replicas=4),
     {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2.0}}),
])
def test_replicas_are_fixed_or_autoscaled_on_the_queue(options, expected):
    assert options.scaling() == expected
    EngineReplica.options(**options.scaling())  # Ray Serve takes them (it checks their values)
