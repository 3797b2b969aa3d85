"""A driver pod starts without an error line, and what Spark made for it goes with it.

The driver pod owns its executor pods and their ConfigMap (queueplane/run/spark/executor_pods.py),
as Spark's own ownership would, but without Spark's wait for the driver pod to be Ready, which
timed out at every start and logged an ERROR with a stack trace. Killed outright (no SIGTERM,
no Spark shutdown), the old driver's executors and ConfigMap are garbage-collected by Kubernetes,
while the Deployment's new driver starts its own.
"""

from __future__ import annotations

import json

import pytest
from helpers import TROUBLE, run_cli, tagged_examples, unique_tag, wait_for
from kube_support import DRIVER, EXECUTOR, pods, ready, show, sized_for_the_node

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

EXECUTOR_CONFIG = "spark-role=executor"


def _config_maps(cluster, namespace: str) -> list[dict]:
    listed = cluster.kubectl("-n", namespace, "get", "configmaps", "-l", EXECUTOR_CONFIG, "-o", "json")
    return json.loads(listed)["items"]


def _running(cluster, namespace: str, but: set[str]) -> list[dict]:
    return [p for p in pods(cluster, namespace, EXECUTOR) if ready(p) and p["metadata"]["name"] not in but]


def _owned_by(obj: dict, pod: dict) -> bool:
    owners = obj["metadata"].get("ownerReferences") or []
    return any(o["kind"] == "Pod" and o["uid"] == pod["metadata"]["uid"] for o in owners)


@pytest.mark.timeout(900)
def test_a_driver_starts_without_an_error_line_and_its_executors_and_their_config_go_with_it(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    namespace = doc["spec"]["deployment"]["namespace"]
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    kube = ["--kubeconfig", str(cluster.kubeconfig), "--values", str(values), "--timeout", "5m"]
    assert run_cli(["apply", str(path), "--yes", "--bootstrap-servers", kafka.bootstrap], cli_env).returncode == 0
    try:
        deployed = run_cli(["deploy", str(path), *kube], cli_env, timeout=420)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        executors = wait_for(
            "a running executor", lambda: [p for p in pods(cluster, namespace, EXECUTOR) if ready(p)], 180
        )
        (driver,) = [p for p in pods(cluster, namespace, DRIVER) if ready(p)]

        # Ready (its queries run) after a start that logged no error line and no stack trace, up
        # to the worker's own line for its first micro-batch.
        def logged() -> str | None:
            log = cluster.kubectl("-n", namespace, "logs", driver["metadata"]["name"])
            return log if " queueplane.worker: batch " in log else None

        log = wait_for("the worker's line for its first batch", logged, 120)
        assert not TROUBLE.findall(log), log[-4000:]

        for executor in executors:
            assert _owned_by(executor, driver), executor["metadata"]
        config = wait_for(
            "the executors' ConfigMap owned by the driver",
            lambda: [c for c in _config_maps(cluster, namespace) if _owned_by(c, driver)],
            30,
        )
        old_executors = {p["metadata"]["name"] for p in executors}
        old_uid = driver["metadata"]["uid"]
        old_config = {c["metadata"]["name"] for c in config}

        # Killed outright: Spark never stops, so nothing but the ownership removes what it made.
        cluster.kubectl(
            "-n", namespace, "delete", "pod", driver["metadata"]["name"], "--grace-period=0", "--force", "--wait=false"
        )

        def collected() -> bool:
            executors_left = {p["metadata"]["name"] for p in pods(cluster, namespace, EXECUTOR)}
            config_left = {c["metadata"]["name"] for c in _config_maps(cluster, namespace)}
            return not (old_executors & executors_left) and not (old_config & config_left)

        wait_for("the old driver's executors and ConfigMap garbage-collected", collected, 120)
        fresh = wait_for("the new driver's running executor", lambda: _running(cluster, namespace, old_executors), 240)
        (new_driver,) = [p for p in pods(cluster, namespace, DRIVER) if p["metadata"]["uid"] != old_uid]
        assert all(_owned_by(p, new_driver) for p in fresh)
    except BaseException:
        show(cluster, namespace)
        raise
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
