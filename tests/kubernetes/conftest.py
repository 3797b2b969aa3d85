"""The local Kubernetes for the tests: started once per session by the code users run.

There is one local cluster per machine; a cluster already running (a developer's) is used as it
is and left running, one the session started is stopped at its end. The session's broker is
restarted once the cluster's bridge exists, so it also listens where pods reach it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from queueplane.local.kubernetes.cluster import LocalKubernetes
from queueplane.local.stack import LocalStack, StackState


@pytest.fixture(scope="session")
def local_kubernetes(queueplane_home: Path) -> Iterator[LocalKubernetes]:
    cluster = LocalKubernetes(home=queueplane_home / "local")
    was_running = bool(cluster.status()["running"])
    cluster.up()
    yield cluster
    if not was_running:
        cluster.down()


@pytest.fixture(scope="session")
def pod_kafka(local_kubernetes: LocalKubernetes, local_kafka: StackState, queueplane_home: Path) -> StackState:
    """The session's broker, listening on the node address as well (what pods use)."""
    state = LocalStack(queueplane_home / "local").up(pods=True)
    assert state.pod_bootstrap, "the broker should listen for pods once the cluster's bridge exists"
    assert state.bootstrap == local_kafka.bootstrap, "host clients keep their address across the restart"
    return state
