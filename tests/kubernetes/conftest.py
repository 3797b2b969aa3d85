"""The cluster for the Kubernetes tests (tests/kubernetes_cluster.py says which), once per session.

A given cluster (QUEUEPLANE_TEST_KUBECONFIG) is used as it is. The local one is started by the
code users run; a local cluster already running (a developer's) is used as it is and left
running. One the session started is stopped after the session's last Kubernetes test, not at
the end of the session: `make test` runs this folder in one process, which goes on to other
tests, and the idle control plane (API server, etcd, kubelet, controllers) would keep taking
CPU and memory from them. Without a cluster, each test here fails at its fixture with one line
saying what is missing. The session's broker is restarted once the cluster is known, so it also
listens where that cluster's pods reach this machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes_cluster import Cluster, Given, Missing, choose, given_cluster, local_cluster, root_on_linux

from queueplane.errors import LocalStackError
from queueplane.local.kubernetes.cluster import LocalKubernetes
from queueplane.local.stack import LocalStack, StackState

KUBERNETES = Path(__file__).parent
_started: list[LocalKubernetes] = []  # the local cluster this session started, until it is stopped


@pytest.fixture(scope="session", autouse=True)
def cluster(queueplane_home: Path) -> Iterator[Cluster]:
    """Autouse, so a test here without a cluster stops at this line before anything starts."""
    missing = None
    try:
        choice = choose(os.environ, root_on_linux())
        given = given_cluster(choice) if isinstance(choice, Given) else None
    except Missing as error:
        missing = str(error)
    if missing is not None:  # outside the handler, so the report is the line alone (no chained error)
        pytest.fail(missing, pytrace=False)
    if given is not None:
        yield given  # neither started nor stopped here
        return
    local = LocalKubernetes(home=queueplane_home / "local")
    was_running = bool(local.status()["running"])
    try:
        local.up()
    except LocalStackError as error:
        missing = f"the local cluster did not start: {error}"
    if missing is not None:
        if not was_running:
            local.down()
        pytest.fail(missing, pytrace=False)
    if not was_running:
        _started.append(local)
    yield local_cluster(local)
    _stop_started()


def _stop_started() -> None:
    while _started:
        _started.pop().down()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the session's last Kubernetes test (its fixtures already torn down), the cluster it
    started stops. The session's items are in run order (tests/parallel.py), and this folder's
    tests all run in one process (its heavy ones last), so none comes after that one here."""
    if not _started:
        return
    items = item.session.items
    later = items[items.index(item) + 1 :]
    if not any(KUBERNETES in Path(str(other.path)).parents for other in later):
        _stop_started()


@pytest.fixture(scope="session")
def pod_kafka(cluster: Cluster, local_kafka: StackState, queueplane_home: Path) -> StackState:
    """The session's broker, listening where the cluster's pods reach this machine as well."""
    state = LocalStack(queueplane_home / "local").up(pods=True, pod_host=cluster.pod_kafka_host)
    assert state.pod_bootstrap == f"{cluster.pod_kafka_host}:{state.pod_port}", "the broker should listen for pods"
    assert state.bootstrap == local_kafka.bootstrap, "host clients keep their address across the restart"
    return state
