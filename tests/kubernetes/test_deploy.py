"""A queue deployed from its Airflow DAG to the test cluster processes records in pods.

A real Airflow triggers the queue's DAG: validate, plan, apply on the real broker, then the
`deploy` task runs `helm upgrade --install --wait` against the test cluster through the
`kubernetes_default` connection, with the cluster values from the `queueplane_cluster_values`
Variable, and `wait_until_ready` waits for the worker. The driver pod then asks the API server,
through its Role, for executor pods, which run the handlers. Records loaded from the host end
accepted (outputs) or in the DLQ, also when an executor pod is force-deleted mid-run (the driver
rides it out, not restarted), and when the driver pod is deleted: it drains on SIGTERM and
exits, and the new driver goes on. Duplicates stay within what was in flight at those faults
(none for the exactlyOnce queue).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
import yaml
from airflow_stack import AirflowStack
from airflow_support import kafka_connection
from helpers import run_cli, tagged_examples, unique_tag, wait_for
from kube_support import (
    DRIVER,
    EXECUTOR,
    dlq_records,
    load,
    not_yet_done,
    outcomes,
    output_ids,
    pods,
    ready,
    restricted_namespace,
    show,
    sized_for_the_node,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

GRACE_S = 90  # the driver's terminationGracePeriodSeconds (charts/queue-worker/templates/deployment.yaml)
# One queue of each kind the chart runs differently: a share group and a consumer group
# (ordered per key, exactly once).
QUEUES = {"share": "queue__cafe__coffee-orders", "consumer": "queue__payments__payment-events"}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, cluster, pod_kafka, kafka) -> Iterator[tuple[AirflowStack, dict]]:
    """A real Airflow whose queue DAGs deploy to the test cluster; namespaces made `restricted` first."""
    home = tmp_path_factory.mktemp("airflow-kubernetes")
    specs = tagged_examples(home / "specs", unique_tag())
    queues = {dag_id: (sized_for_the_node(specs[dag_id]), specs[dag_id]) for dag_id in QUEUES.values()}
    for doc, _path in queues.values():
        restricted_namespace(cluster, doc["spec"]["deployment"]["namespace"])
    kubernetes = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(cluster.kubeconfig)}}
    stack = AirflowStack.create(
        home,
        {
            "QUEUEPLANE_SPECS_DIR": str(home / "specs"),
            "QUEUEPLANE_HOME": str(home / "queueplane"),
            "AIRFLOW_CONN_KAFKA_DEFAULT": kafka_connection(kafka),
            "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(kubernetes),
            "AIRFLOW_VAR_QUEUEPLANE_CLUSTER_VALUES": json.dumps(cluster.values(pod_kafka.pod_bootstrap)),
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
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _within_in_flight(outputs: list[str], in_flight: int, doc: dict) -> None:
    """exactlyOnce: each output once (read_committed). At-least-once: no more duplicates than the
    records the faults so far could have caught in flight."""
    duplicates = len(outputs) - len(set(outputs))
    if doc["spec"]["processing"].get("exactlyOnce"):
        assert duplicates == 0, f"{duplicates} outputs seen twice by a read_committed reader"
    else:
        assert duplicates <= in_flight, f"{duplicates} duplicate outputs, above the {in_flight} records in flight"


@pytest.mark.timeout(1200)  # a driver, its executors and three loads on a two-core node
@pytest.mark.parametrize("kind", sorted(QUEUES))
def test_a_queue_deployed_from_airflow_processes_loads_in_pods_through_a_killed_executor_and_driver(
    kind, airflow, cluster, kafka, cli_env
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
        (driver,) = pods(cluster, namespace, DRIVER)
        assert driver["status"]["phase"] == "Running"
        wait_for("an executor pod created by the driver", lambda: pods(cluster, namespace, EXECUTOR), 180)
        # `queueplane status` sees what kubectl sees: the release deployed, the driver and its executors.
        kubeconfig = ["--kubeconfig", str(cluster.kubeconfig)]
        shown = run_cli(["status", spec, *host, *kubeconfig, "-o", "json"], cli_env)
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert status["release"]["status"] == "deployed" and status["release"]["namespace"] == namespace, status
        names = {p["component"]: p["name"] for p in status["pods"]}
        assert names.get("driver") == driver["metadata"]["name"] and "executor" in names, status["pods"]

        poison = load(spec, 400, host, cli_env)
        wait_for("the first load to settle", lambda: outcomes(kafka, doc, 400 - poison, poison)[1] >= poison, 300)

        # A second load, and an executor pod killed while it runs: the driver asks for a new one.
        poison += load(spec, 400, host, cli_env)
        victim = pods(cluster, namespace, EXECUTOR)[0]["metadata"]["name"]
        in_flight = not_yet_done(kafka, doc)  # read just before the kill: only larger than at it
        cluster.kubectl("-n", namespace, "delete", "pod", victim, "--grace-period=0", "--force")
        wait_for(
            "a replacement executor pod",
            lambda: [p for p in pods(cluster, namespace, EXECUTOR) if p["metadata"]["name"] != victim],
            180,
        )

        def settled() -> tuple[set[str], int] | None:
            ids, dead = outcomes(kafka, doc, 800 - poison, poison)
            return (ids, dead) if len(ids) >= 800 - poison and dead >= poison else None

        ids, dead = wait_for("both loads to settle", settled, 420)
        assert len(ids) == 800 - poison, "every accepted record has its output"
        assert dead == poison, "only the poison is dead-lettered (each record counted once)"
        _within_in_flight(output_ids(kafka, doc, 800 - poison), in_flight, doc)
        (same,) = pods(cluster, namespace, DRIVER)
        assert same["metadata"]["name"] == driver["metadata"]["name"], "the driver rode the executor's loss out"
        assert all(c["restartCount"] == 0 for c in same["status"]["containerStatuses"]), same["status"]

        # `kubectl get queues` shows what the driver reports on its Queue: the backlog gone, the
        # poison counted in the DLQ, the handler's error, and its conditions in `describe`.
        name = doc["metadata"]["name"]

        settled_conditions = {"Ready": "True", "Lagging": "False", "DeadLettering": "False", "Degraded": "False"}

        in_dlq = dlq_records(kafka, doc, poison)  # a dead letter written twice by a killed executor counts twice

        def reported_caught_up() -> dict | None:
            queue = json.loads(cluster.kubectl("-n", namespace, "get", "queue", name, "-o", "json"))
            status = queue.get("status", {})
            caught_up = status.get("lag") == 0 and status.get("deadLetters") == in_dlq
            conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
            running = status.get("phase") == "Running"
            return queue if caught_up and running and conditions == settled_conditions else None

        queue = wait_for("the Queue status to show the loads settled", reported_caught_up, 60)
        assert queue["spec"] == yaml.safe_load(path.read_text())["spec"], "the spec as deployed"
        assert queue["status"]["executorsRunning"] >= 1 and "not JSON" in queue["status"]["lastError"], queue
        table = cluster.kubectl("get", "queues", "-A")
        header, *rows = table.splitlines()
        assert header.split() == [
            *("NAMESPACE", "NAME", "TEAM", "TYPE", "PHASE", "LAG", "OLDEST", "RATE", "EXECUTORS", "DLQ"),
            *("LAST", "ERROR", "AGE"),
        ], table
        (row,) = [r.split() for r in rows if r.split()[:2] == [namespace, name]]
        assert row[2:5] == [doc["metadata"]["team"], kind, "Running"] and row[5] == "0" and row[9] == str(in_dlq), table
        described = cluster.kubectl("-n", namespace, "describe", "queue", name)
        printed = re.findall(r"Status:\s+(True|False|Unknown)\s+Type:\s+(\w+)", described)
        shown = {condition: value for value, condition in printed}
        assert shown == settled_conditions, described

        # A third load, and the driver pod deleted as a rollout or a node drain deletes it: SIGTERM,
        # then SIGKILL after the grace period. The worker drains and exits by itself well before.
        poison += load(spec, 400, host, cli_env)
        old = pods(cluster, namespace, DRIVER)[0]["metadata"]["name"]
        follow = subprocess.Popen(
            cluster.kubectl_command("-n", namespace, "logs", "-f", old),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        time.sleep(3)  # part of the load in hand
        in_flight += not_yet_done(kafka, doc)
        asked = time.monotonic()
        cluster.kubectl("-n", namespace, "delete", "pod", old, "--wait=true", "--timeout=120s")
        took = time.monotonic() - asked
        last_words = follow.communicate(timeout=60)[0]
        assert "SIGTERM: finishing the batch in hand" in last_words, last_words[-3000:]
        summaries = [json.loads(line) for line in last_words.splitlines() if line.startswith('{"queue"')]
        assert summaries, f"the old driver returned and printed its summary: {last_words[-3000:]}"
        assert took < GRACE_S, f"the old driver took {took:.0f}s: SIGKILLed at the end of the grace period"

        def new_driver_ready() -> list[dict]:
            drivers = pods(cluster, namespace, DRIVER)
            return [p for p in drivers if p["metadata"]["name"] != old and ready(p)]

        wait_for("a new driver pod, ready", new_driver_ready, 240)

        def all_settled() -> tuple[set[str], int] | None:
            ids, dead = outcomes(kafka, doc, 1200 - poison, poison)
            return (ids, dead) if len(ids) >= 1200 - poison and dead >= poison else None

        ids, dead = wait_for("the third load to settle under the new driver", all_settled, 420)
        assert len(ids) == 1200 - poison and dead == poison
        _within_in_flight(output_ids(kafka, doc, 1200 - poison), in_flight, doc)
    except BaseException:
        show(cluster, namespace)
        raise
    finally:
        # Frees the node for the next queue; the fixture's own delete then finds nothing.
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
