"""A deploy into a namespace that exists goes ahead only where Pod Security enforces restricted.

The platform's Kubernetes credentials can deploy anywhere; a namespace someone made without a
Pod Security level (which the cluster admits as privileged) or at baseline would let a team's
image run as root or mount the node. The deploy reads the namespace's labels first and refuses
before helm runs, so nothing is installed; once the namespace enforces restricted, the same
spec deploys.
"""

from __future__ import annotations

import json

import pytest
from helpers import run_cli, tagged_examples, unique_tag
from kube_support import sized_for_the_node

from queueplane.deploy.helm import run_helm

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

ENFORCE = "pod-security.kubernetes.io/enforce"


def _releases(cluster, namespace: str) -> list[str]:
    listing = run_helm(["list", "--namespace", namespace, "-o", "json"], kubeconfig=str(cluster.kubeconfig))
    return [entry["name"] for entry in json.loads(listing.stdout)]


@pytest.mark.timeout(900)
def test_an_existing_namespace_unlabelled_or_baseline_is_refused_and_once_restricted_is_deployed_into(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    release, namespace = doc["metadata"]["name"], doc["spec"]["deployment"]["namespace"]
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    kube = ["--kubeconfig", str(cluster.kubeconfig), "--values", str(values)]
    assert run_cli(["apply", str(path), "--yes", "--bootstrap-servers", kafka.bootstrap], cli_env).returncode == 0

    def deploy():
        return run_cli(["deploy", str(path), *kube, "--timeout", "5m"], cli_env, timeout=420)

    def refused(found: str) -> None:
        result = deploy()
        said = result.stderr
        assert result.returncode == 1, result.stdout + said
        assert f"{path}: /spec/deployment/namespace: namespace {namespace} {found}" in said, said
        assert "nothing was deployed" in said and "Traceback" not in said, said
        assert f"kubectl label namespace {namespace} {ENFORCE}=restricted" in said, said
        assert _releases(cluster, namespace) == [], "helm never ran"
        assert cluster.kubectl("-n", namespace, "get", "deployments", "-o", "name").strip() == ""

    cluster.kubectl("create", "namespace", namespace)  # the platform's, with no Pod Security level
    try:
        refused(f"has no {ENFORCE} label")
        cluster.kubectl("label", "namespace", namespace, f"{ENFORCE}=baseline")
        refused(f'enforces Pod Security "baseline" ({ENFORCE}=baseline), laxer than "restricted"')

        cluster.kubectl("label", "namespace", namespace, f"{ENFORCE}=restricted", "--overwrite")
        deployed = deploy()
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert _releases(cluster, namespace) == [release]
        labels = json.loads(cluster.kubectl("get", "namespace", namespace, "-o", "json"))["metadata"]["labels"]
        assert labels[ENFORCE] == "restricted" and "app.kubernetes.io/managed-by" not in labels, "left as it was"
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
