"""The RPC between a release's driver and executors is authenticated with the release's Secret.

Executors that hold the secret register and run; the Secret survives an upgrade (an executor
started by the old driver during a rollout must still match); an executor given another
secret is refused by the driver. No pod's spec holds the secret itself.
"""

from __future__ import annotations

import base64
import json

import pytest
from helpers import run_cli, tagged_examples, unique_tag, wait_for
from kube_support import EXECUTOR, pods, ready, show, sized_for_the_node

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]


def _secret(cluster, namespace: str, name: str) -> dict[str, str]:
    return json.loads(cluster.kubectl("-n", namespace, "get", "secret", name, "-o", "json"))["data"]


@pytest.mark.timeout(900)
def test_executors_need_the_releases_secret_which_no_pod_spec_holds_and_an_upgrade_keeps(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    release, namespace = doc["metadata"]["name"], doc["spec"]["deployment"]["namespace"]
    secret_name = f"{release}-spark-auth"
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    kube = ["--kubeconfig", str(cluster.kubeconfig), "--values", str(values), "--timeout", "5m"]
    assert run_cli(["apply", str(path), "--yes", "--bootstrap-servers", kafka.bootstrap], cli_env).returncode == 0
    try:
        first = run_cli(["deploy", str(path), *kube], cli_env, timeout=420)
        assert first.returncode == 0, first.stdout + first.stderr
        executor = wait_for(
            "a running executor", lambda: [p for p in pods(cluster, namespace, EXECUTOR) if ready(p)], 180
        )[0]
        data = _secret(cluster, namespace, secret_name)
        secret = base64.b64decode(data["secret-base64"]).decode()
        everything = cluster.kubectl("-n", namespace, "get", "pods,deployments,configmaps", "-o", "json")
        assert secret not in everything and base64.b64decode(data["secret"]).decode() not in everything
        (variable,) = [e for e in executor["spec"]["containers"][0]["env"] if e["name"] == "_SPARK_AUTH_SECRET"]
        assert variable == {
            "name": "_SPARK_AUTH_SECRET",
            "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "secret-base64"}},
        }

        # An upgrade (another value, a new driver) keeps the Secret as it was.
        again = run_cli(["deploy", str(path), *kube, "--set", "spark.ui.enabled=false"], cli_env, timeout=420)
        assert again.returncode == 0, again.stdout + again.stderr
        assert _secret(cluster, namespace, secret_name) == data
        wait_for(
            "a running executor after the upgrade",
            lambda: [p for p in pods(cluster, namespace, EXECUTOR) if ready(p)],
            180,
        )

        # An executor holding another secret: the driver refuses it.
        wrong = base64.b64encode(base64.b64encode(b"not-the-release-secret")).decode()
        patch = json.dumps({"data": {"secret-base64": wrong}})
        cluster.kubectl("-n", namespace, "patch", "secret", secret_name, "--type=merge", "-p", patch)
        victims = {p["metadata"]["name"] for p in pods(cluster, namespace, EXECUTOR)}
        for name in victims:
            cluster.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")

        def refused() -> str | None:
            for pod in pods(cluster, namespace, EXECUTOR):
                if pod["metadata"]["name"] in victims:
                    continue
                log = cluster.kubectl("-n", namespace, "logs", pod["metadata"]["name"], check=False)
                if "Authentication failed" in log or "Exception while bootstrapping client" in log:
                    return log
            return None

        try:
            wait_for("a replacement executor refused by the driver", refused, 240)
        except BaseException:
            show(cluster, namespace)
            raise
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
