"""A queue deployed with Helm to the local Kubernetes processes records in pods.

`queueplane deploy` runs `helm upgrade --install --wait` with the local cluster's values; the
driver pod then asks the API server, through its Role, for executor pods, which run the
handlers. Records loaded from the host end accepted (outputs) or in the DLQ, also when an
executor pod is force-deleted mid-run.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import yaml
from helpers import run_cli, tagged_examples, unique_tag
from worker_support import read_all

from queueplane.local.kubernetes import images
from queueplane.local.kubernetes.values import write_local_values

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
EXECUTOR = "app.kubernetes.io/component=executor"
DRIVER = "app.kubernetes.io/component=driver"


def _spec(tmp_path, example: str) -> tuple[dict, str]:
    """An example spec with unique Kafka names, sized for a two-core node, in its own namespace."""
    path = next(p for p in tagged_examples(tmp_path, unique_tag()).values() if p.name == example)
    doc = yaml.safe_load(path.read_text())
    namespace = f"{doc['metadata']['team']}-{uuid.uuid4().hex[:6]}"
    doc["spec"]["deployment"] = {**doc["spec"]["deployment"], "namespace": namespace}
    doc["spec"]["deployment"]["executor"] = {"cores": 1, "memory": "1g"}
    doc["spec"]["autoscaling"] = {"minExecutors": 1, "maxExecutors": 1, "targetLagSeconds": 30}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc, str(path)


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
@pytest.mark.parametrize("example", ["coffee-orders.yaml", "payment-events.yaml"])
def test_a_deployed_queue_processes_a_load_in_pods_and_survives_a_killed_executor(
    example, local_kubernetes, pod_kafka, kafka, cli_env, tmp_path
):
    doc, spec = _spec(tmp_path, example)
    namespace = doc["spec"]["deployment"]["namespace"]
    values = write_local_values(tmp_path / "cluster-values.yaml", images.worker_image(), pod_kafka.pod_bootstrap)
    host = ["--bootstrap-servers", kafka.bootstrap]
    applied = run_cli(["apply", spec, "--yes", *host], cli_env)
    assert applied.returncode == 0, applied.stderr
    _restricted_namespace(local_kubernetes, namespace)
    try:
        deploy = ["deploy", spec, "--kubeconfig", str(local_kubernetes.kubeconfig), "--values", str(values)]
        deployed = run_cli([*deploy, "--timeout", "5m"], cli_env, timeout=420)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
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
        local_kubernetes.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
