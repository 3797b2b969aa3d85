"""The embedded local stack: idempotent up, down by its own pid, state that survives restarts."""

from __future__ import annotations

import os
import re

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from helpers import run_cli

from queueplane.errors import LocalStackError
from queueplane.local.processes import port_open
from queueplane.local.stack import LocalStack

pytestmark = pytest.mark.kafka


def test_up_is_idempotent_and_status_reports_the_broker(local_kafka, cli_env):
    result = run_cli(["local", "up"], cli_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"bootstrap.servers={local_kafka.bootstrap}"
    status = run_cli(["local", "status", "-o", "json"], cli_env)
    assert status.returncode == 0
    assert f'"bootstrap.servers": "{local_kafka.bootstrap}"' in status.stdout
    assert f'"pid": {local_kafka.pid}' in status.stdout


def test_kafka_tools_run_against_the_local_broker(local_kafka, cli_env):
    result = run_cli(["local", "kafka", "features", "describe"], cli_env)
    assert result.returncode == 0, result.stderr
    level = re.search(r"Feature: share\.version\s.*FinalizedVersionLevel: (\d+)", result.stdout)
    assert level and int(level.group(1)) >= 1


def test_down_stops_by_pid_and_up_again_keeps_port_and_topics(tmp_path):
    stack = LocalStack(tmp_path / "local")
    first = stack.up()
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic("survives.restart", 1, 1)])["survives.restart"].result()
    assert stack.down() is True
    with pytest.raises(ProcessLookupError):
        os.kill(first.pid, 0)
    assert stack.status()["running"] is False
    assert stack.down() is False  # nothing left to stop
    second = stack.up()
    try:
        assert second.port == first.port and second.pid != first.pid
        admin = AdminClient({"bootstrap.servers": second.bootstrap})
        assert "survives.restart" in admin.list_topics(timeout=10).topics
    finally:
        stack.down(purge=True)
    assert not (tmp_path / "local" / "data").exists()


def test_the_pod_listener_is_on_the_address_given_kept_by_a_plain_up_and_moved_to_another(tmp_path):
    """Pods of a cluster other than the local one reach this machine at another address (a kind
    network's gateway, say): the broker listens for them and advertises itself there, an `up` that
    asks nothing leaves it, and another address moves it, on the same port. 127.0.0.2 and
    127.0.0.3 stand for two such addresses (Linux's loopback answers all of 127.0.0.0/8)."""

    def advertised(bootstrap: str) -> list[str]:
        brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20).brokers.values()
        return [f"{broker.host}:{broker.port}" for broker in brokers]

    stack = LocalStack(tmp_path / "local")
    try:
        first = stack.up(pods=True, pod_host="127.0.0.2")
        assert first.pod_bootstrap == f"127.0.0.2:{first.pod_port}"
        assert advertised(first.pod_bootstrap) == [first.pod_bootstrap]
        assert advertised(first.bootstrap) == [first.bootstrap], "host clients keep their own listener"
        assert not port_open("127.0.0.3", first.pod_port), "bound to the address given only"

        kept = stack.up()
        assert (kept.pid, kept.pod_bootstrap) == (first.pid, first.pod_bootstrap)

        said: list[str] = []
        moved = stack.up(said.append, pods=True, pod_host="127.0.0.3")
        assert moved.pid != first.pid and moved.port == first.port and moved.pod_port == first.pod_port
        assert "restarting to move the listener for Kubernetes pods to 127.0.0.3" in said
        assert moved.pod_bootstrap == f"127.0.0.3:{first.pod_port}"
        assert advertised(moved.pod_bootstrap) == [moved.pod_bootstrap]
        assert not port_open("127.0.0.2", first.pod_port)
        recorded = stack.read_state()
        assert recorded is not None and recorded.pod_bootstrap == moved.pod_bootstrap
    finally:
        stack.down(purge=True)


def test_a_broker_without_share_groups_fails_clearly(tmp_path):
    stack = LocalStack(tmp_path / "local", share_version=0)
    with pytest.raises(LocalStackError, match=r"share\.version=0; share groups need >= 1"):
        stack.up()
    assert stack.running_state() is None


def test_a_cluster_id_that_starts_with_a_dash_formats(tmp_path, monkeypatch):
    """One random id in 64 starts with "-"; the storage tool must not take it for an option."""
    from queueplane.local import stack as stack_module

    monkeypatch.setattr(stack_module, "_cluster_id", lambda: "-Tq1nZ0ESbiMmHTmdL_n2w")
    stack = LocalStack(tmp_path / "local")
    try:
        state = stack.up()
        meta = AdminClient({"bootstrap.servers": state.bootstrap}).list_topics(timeout=20)
        assert meta.cluster_id == "-Tq1nZ0ESbiMmHTmdL_n2w"
    finally:
        stack.down(purge=True)
