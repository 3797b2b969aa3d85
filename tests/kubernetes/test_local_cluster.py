"""The test cluster is a real one: a Ready node, Pod Security enforced, and the worker image
running as a pod that reaches the host's Kafka broker. On the local cluster the node is also the
one it pins: its Kubernetes version, containerd and node address."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes_cluster import Cluster

from queueplane.local.kubernetes import build
from queueplane.local.kubernetes.layout import NODE_IP

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A `restricted` namespace of the test's own, deleted after it (a given cluster is someone's)."""
    name = f"qp-test-{uuid.uuid4().hex[:6]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": RESTRICTED}}
    created = _apply(cluster, body)
    assert created.returncode == 0, created.stderr
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _apply(cluster: Cluster, body: dict) -> subprocess.CompletedProcess:
    cmd = cluster.kubectl_command("apply", "-f", "-")
    return subprocess.run(cmd, input=yaml.safe_dump(body), capture_output=True, text=True)


def _pod(name: str, namespace: str, cluster: Cluster, command: list[str], secure: bool = True) -> dict:
    container: dict = {
        "name": "main",
        "image": cluster.image,
        "imagePullPolicy": cluster.pull_policy,
        "command": command,
    }
    spec: dict = {"restartPolicy": "Never", "containers": [container]}
    if secure:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 185, "seccompProfile": {"type": "RuntimeDefault"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def test_the_node_is_ready_at_the_clusters_version_and_the_local_one_at_the_pinned_version(cluster):
    node = json.loads(cluster.kubectl("get", "node", cluster.node, "-o", "json"))
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    version = json.loads(cluster.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == version
    if cluster.local:
        assert version == build.KUBERNETES_VERSION
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == NODE_IP


def test_a_restricted_namespace_refuses_a_pod_that_is_not(cluster, namespace):
    refused = _apply(cluster, _pod("loose", namespace, cluster, ["true"], secure=False))
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr


def test_the_worker_image_runs_as_a_pod_and_reaches_the_brokers_pod_listener(cluster, pod_kafka, namespace):
    probe = textwrap.dedent(f"""
        import json, os, subprocess, sys
        import pyspark, queueplane
        from confluent_kafka.admin import AdminClient
        from importlib.metadata import version
        admin = AdminClient({{"bootstrap.servers": "{pod_kafka.pod_bootstrap}"}})
        brokers = [str(b) for b in admin.list_topics(timeout=20).brokers.values()]
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
        jars = sorted(os.listdir(os.path.join(os.environ["SPARK_HOME"], "jars")))
        print(json.dumps({{"python": sys.version.split()[0], "queueplane": version("queueplane"),
                          "pyspark": pyspark.__version__, "java": java, "brokers": brokers, "uid": os.getuid(),
                          "connector": [j for j in jars if "kafka" in j]}}))
    """)
    pod = _pod("probe", namespace, cluster, ["python3", "-c", probe])
    created = _apply(cluster, pod)
    assert created.returncode == 0, created.stderr
    cluster.kubectl(
        "-n", namespace, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/probe", "--timeout=120s", check=False
    )
    logs = cluster.kubectl("-n", namespace, "logs", "probe")
    found = json.loads(logs.strip().splitlines()[-1])
    from importlib.metadata import version

    import pyspark

    assert found["queueplane"] == version("queueplane")
    assert found["pyspark"] == pyspark.__version__
    assert found["python"].rsplit(".", 1)[0] == ".".join(map(str, sys.version_info[:2]))
    assert found["uid"] == 185
    assert found["brokers"] and pod_kafka.pod_bootstrap in found["brokers"][0]
    assert any(j.startswith("spark-sql-kafka-0-10_2.13-") for j in found["connector"])
    assert any(j.startswith("kafka-clients-") for j in found["connector"])
