"""Extension points set in cluster values reach the pods of a running release.

`queueplane deploy` installs a share queue with an affinity for the driver, another for the
executors (which Spark creates from the chart's executor pod template) and both
PodDisruptionBudgets. The pods the cluster runs carry each affinity; each budget counts its
pods and refuses their eviction. The release starts with the chart's own Spark secret, as one
installed before renders named it; the next deploy names it, and the Secret stays as it was
(marked for helm to keep), and the driver and its executors run on. `helm test` passes.
"""

from __future__ import annotations

import base64
import json
import subprocess

import pytest
import yaml
from helpers import run_cli, tagged_examples, unique_tag, wait_for
from kube_support import DRIVER, EXECUTOR, pods, ready, restricted_namespace, show, sized_for_the_node

from queueplane.deploy.helm import run_helm

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]


def _budget(cluster, namespace: str, name: str) -> dict:
    return json.loads(cluster.kubectl("-n", namespace, "get", "pdb", name, "-o", "json"))


def _evict(cluster, namespace: str, pod: str, folder) -> subprocess.CompletedProcess:
    """The Eviction API, as a node drain asks it for each pod."""
    eviction = folder / f"evict-{pod}.json"
    eviction.write_text(
        json.dumps({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}})
    )
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    command = cluster.kubectl_command("create", "--raw", path, "-f", str(eviction))
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(900)
def test_an_affinity_and_disruption_budgets_in_cluster_values_reach_the_pods(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    release, namespace = doc["metadata"]["name"], doc["spec"]["deployment"]["namespace"]
    node = json.loads(cluster.kubectl("get", "node", cluster.node, "-o", "json"))
    hostname = node["metadata"]["labels"]["kubernetes.io/hostname"]
    driver_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [hostname]}]}
                ]
            }
        }
    }
    executor_affinity = {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {
                            "matchLabels": {
                                "app.kubernetes.io/instance": release,
                                "app.kubernetes.io/component": "driver",
                            }
                        },
                    },
                }
            ]
        }
    }
    extensions = tmp_path / "extensions.yaml"
    extensions.write_text(
        yaml.safe_dump(
            {
                "driverPod": {"affinity": driver_affinity},
                "executorPod": {"affinity": executor_affinity},
                "podDisruptionBudget": {"driver": {"enabled": True}, "executor": {"enabled": True}},
            }
        )
    )
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    deploy = [
        "deploy",
        str(path),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--values",
        str(values),
        "--values",
        str(extensions),
        "--timeout",
        "5m",
    ]
    assert run_cli(["apply", str(path), "--yes", "--bootstrap-servers", kafka.bootstrap], cli_env).returncode == 0
    restricted_namespace(cluster, namespace)
    try:
        # The chart's own Secret, as a release installed before renders named one has it.
        first = run_cli([*deploy, "--set", "sparkAuth.existingSecret="], cli_env, timeout=420)
        assert first.returncode == 0, first.stdout + first.stderr
        executor = wait_for(
            "a running executor", lambda: [p for p in pods(cluster, namespace, EXECUTOR) if ready(p)], 180
        )[0]
        (driver,) = [p for p in pods(cluster, namespace, DRIVER) if ready(p)]
        assert driver["spec"]["affinity"] == driver_affinity
        assert executor["spec"]["affinity"] == executor_affinity, "through the chart's executor pod template"

        for component, pod in (("driver", driver), ("executor", executor)):
            name = f"{release}-{component}"
            counted = wait_for(
                f"the {component} budget counting its pod",
                lambda n=name: (s := _budget(cluster, namespace, n).get("status", {})).get("currentHealthy") and s,
                60,
            )
            running = len([p for p in pods(cluster, namespace, f"app.kubernetes.io/component={component}")])
            assert counted["expectedPods"] == running and counted["disruptionsAllowed"] == 0, counted
            refused = _evict(cluster, namespace, pod["metadata"]["name"], tmp_path)
            assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr

        # helm test: a restricted pod asks the driver's /readyz through its Service.
        tested = run_helm(["test", release, "--namespace", namespace, "--logs"], kubeconfig=str(cluster.kubeconfig))
        assert "/readyz 200" in tested.stdout, tested.stdout

        # The next deploy names the Secret (as every render does now): the chart's copy stays, unchanged.
        secret = f"{release}-spark-auth"
        before = json.loads(cluster.kubectl("-n", namespace, "get", "secret", secret, "-o", "json"))
        second = run_cli(deploy, cli_env, timeout=420)
        assert second.returncode == 0, second.stdout + second.stderr
        after = json.loads(cluster.kubectl("-n", namespace, "get", "secret", secret, "-o", "json"))
        assert after["data"] == before["data"]
        assert after["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        manifest = run_helm(
            ["get", "manifest", release, "--namespace", namespace], kubeconfig=str(cluster.kubeconfig)
        ).stdout
        assert "kind: Secret" not in manifest, "the release no longer renders a Secret"
        assert base64.b64decode(after["data"]["secret-base64"]).decode() == after["data"]["secret"]
        running = [p["metadata"]["name"] for p in pods(cluster, namespace, EXECUTOR) if ready(p)]
        assert executor["metadata"]["name"] in running, "no rollout: the driver and its executors ran on"
    except BaseException:
        show(cluster, namespace)
        raise
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
