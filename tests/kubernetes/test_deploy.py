"""A queue deployed from its Airflow DAG to the local Kubernetes processes records in pods.

A real Airflow triggers the queue's DAG: validate, plan, apply on the real broker, then the
`deploy` task runs `helm upgrade --install --wait` against the local cluster through the
`kubernetes_default` connection, with the cluster values from the `queueplane_cluster_values`
Variable, and `wait_until_ready` waits for the worker. The driver pod then asks the API server,
through its Role, for executor pods, which run the handlers. Records loaded from the host end
accepted (outputs) or in the DLQ, also when an executor pod is force-deleted mid-run.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from airflow_stack import AirflowStack
from airflow_support import kafka_connection
from helpers import run_cli, tagged_examples, unique_tag
from worker_support import read_all

from queueplane.local.kubernetes import images
from queueplane.local.kubernetes.values import local_values

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
EXECUTOR = "app.kubernetes.io/component=executor"
DRIVER = "app.kubernetes.io/component=driver"
# One queue of each kind the chart runs differently: a share group and a consumer group
# (ordered per key, exactly once).
QUEUES = {"share": "queue__cafe__coffee-orders", "consumer": "queue__payments__payment-events"}


def _sized_for_the_node(path: Path) -> dict:
    """The spec in its own namespace, sized for a two-core node (one executor of one core)."""
    doc = yaml.safe_load(path.read_text())
    namespace = f"{doc['metadata']['team']}-{uuid.uuid4().hex[:6]}"
    doc["spec"]["deployment"] = {**doc["spec"]["deployment"], "namespace": namespace}
    doc["spec"]["deployment"]["executor"] = {"cores": 1, "memory": "1g"}
    doc["spec"]["autoscaling"] = {"minExecutors": 1, "maxExecutors": 1, "targetLagSeconds": 30}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, local_kubernetes, pod_kafka, kafka) -> Iterator[tuple[AirflowStack, dict]]:
    """A real Airflow whose queue DAGs deploy to the local cluster; namespaces made `restricted` first."""
    home = tmp_path_factory.mktemp("airflow-kubernetes")
    specs = tagged_examples(home / "specs", unique_tag())
    queues = {dag_id: (_sized_for_the_node(specs[dag_id]), specs[dag_id]) for dag_id in QUEUES.values()}
    for doc, _path in queues.values():
        _restricted_namespace(local_kubernetes, doc["spec"]["deployment"]["namespace"])
    kubernetes = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(local_kubernetes.kubeconfig)}}
    stack = AirflowStack.create(
        home,
        {
            "QUEUEPLANE_SPECS_DIR": str(home / "specs"),
            "QUEUEPLANE_HOME": str(home / "queueplane"),
            "AIRFLOW_CONN_KAFKA_DEFAULT": kafka_connection(kafka),
            "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(kubernetes),
            "AIRFLOW_VAR_QUEUEPLANE_CLUSTER_VALUES": json.dumps(
                local_values(images.worker_image(), pod_kafka.pod_bootstrap)
            ),
        },
    )
    try:
        stack.start()
        for dag_id in QUEUES.values():
            stack.wait_for(lambda d=dag_id: stack.api("GET", f"/dags/{d}")[0] == 200, f"the DAG {dag_id}", 240)
        yield stack, queues
    finally:
        stack.stop()
        for doc, _path in queues.values():
            namespace = doc["spec"]["deployment"]["namespace"]
            local_kubernetes.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _pods(cluster, namespace: str, selector: str) -> list[dict]:
    listing = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json"))
    return listing["items"]


def _wait_for(what: str, check, timeout_s: float, every_s: float = 2.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _restricted_namespace(cluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in RESTRICTED.items()))


def _show(cluster, namespace: str) -> None:
    """The pods and the driver's log, for a failed run's report (pytest prints captured output)."""
    print(cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False))
    log = cluster.kubectl("-n", namespace, "logs", "-l", DRIVER, "--tail=80", check=False)
    print("\n".join(line for line in log.splitlines() if "py4j" not in line))


def _load(spec: str, count: int, host: list[str], env: dict[str, str]) -> int:
    """Produce ``count`` records, 2% poison; returns how many are poison."""
    loaded = run_cli(["load", spec, "--count", str(count), "--poison-rate", "0.02", "-o", "json", *host], env)
    assert loaded.returncode == 0, loaded.stderr
    return json.loads(loaded.stdout)["poison"]


def _outcomes(kafka, doc: dict, accepted: int, dead: int) -> tuple[set[str], int]:
    """Distinct output ids and the DLQ's record count, once at least the expected numbers are there."""
    spec = doc["spec"]
    dlq = spec.get("deadLetter", {}).get("topic", f"{spec['topic']['name']}.dlq")
    outputs = read_all(kafka, spec["processing"]["output"]["topic"], expect_at_least=accepted, timeout_s=5)
    values = [json.loads(m.value()) for m in outputs]
    return {v.get("id") or v.get("order") for v in values}, len(read_all(kafka, dlq, expect_at_least=dead, timeout_s=5))


@pytest.mark.timeout(900)  # a driver, its executors and two loads on a two-core node
@pytest.mark.parametrize("kind", sorted(QUEUES))
def test_a_queue_deployed_from_airflow_processes_a_load_in_pods_and_survives_a_killed_executor(
    kind, airflow, local_kubernetes, kafka, cli_env
):
    stack, queues = airflow
    dag_id = QUEUES[kind]
    doc, path = queues[dag_id]
    spec, namespace = str(path), doc["spec"]["deployment"]["namespace"]
    host = ["--bootstrap-servers", kafka.bootstrap]
    try:
        status, run = stack.api("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": {}})
        assert status == 200, run
        finished = stack.wait_for_run(dag_id, run["dag_run_id"], timeout=480)
        states = stack.task_states(dag_id, run["dag_run_id"])
        assert finished["state"] == "success", (states, stack.log_tail("scheduler"))
        assert states["deploy"] == "success" and states["wait_until_ready"] == "success", states
        (driver,) = _pods(local_kubernetes, namespace, DRIVER)
        assert driver["status"]["phase"] == "Running"
        _wait_for("an executor pod created by the driver", lambda: _pods(local_kubernetes, namespace, EXECUTOR), 180)

        poison = _load(spec, 400, host, cli_env)
        _wait_for("the first load to settle", lambda: _outcomes(kafka, doc, 400 - poison, poison)[1] >= poison, 300)

        # A second load, and an executor pod killed while it runs: the driver asks for a new one.
        poison += _load(spec, 400, host, cli_env)
        victim = _pods(local_kubernetes, namespace, EXECUTOR)[0]["metadata"]["name"]
        local_kubernetes.kubectl("-n", namespace, "delete", "pod", victim, "--grace-period=0", "--force")
        _wait_for(
            "a replacement executor pod",
            lambda: [p for p in _pods(local_kubernetes, namespace, EXECUTOR) if p["metadata"]["name"] != victim],
            180,
        )

        def settled() -> tuple[set[str], int] | None:
            ids, dead = _outcomes(kafka, doc, 800 - poison, poison)
            return (ids, dead) if len(ids) >= 800 - poison and dead >= poison else None

        ids, dead = _wait_for("both loads to settle", settled, 420)
        assert len(ids) == 800 - poison, "every accepted record has its output"
        assert dead == poison, "only the poison is dead-lettered"
    except BaseException:
        _show(local_kubernetes, namespace)
        raise
    finally:
        # Frees the node for the next queue; the fixture's own delete then finds nothing.
        local_kubernetes.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
