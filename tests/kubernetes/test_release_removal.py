"""A removed spec's worker on the local Kubernetes: apply uninstalls its Helm release (the worker
drains on SIGTERM), its Queue object goes with the release, and then its group and owner records
go; its topics stay (deletionPolicy retain). The Kafka-only parts of removal are
tests/integration/test_removal.py's."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli, tagged_examples, unique_tag, wait_for
from kube_support import DRIVER, pods, ready, sized_for_the_node

from queueplane.deploy.helm import run_helm
from queueplane.kafka import clients
from queueplane.kafka.owners import read_records
from queueplane.kafka.protocol import describe_share_group

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]


@pytest.mark.timeout(900)
def test_a_removed_spec_uninstalls_its_release_and_queue_object_then_its_group_and_records_go(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    name, namespace = doc["metadata"]["name"], doc["spec"]["deployment"]["namespace"]
    topic, group, queue = doc["spec"]["topic"]["name"], doc["spec"]["group"]["id"], f"cafe/{name}"
    folder = path.parent  # the team's folder: the removal is found under it
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig)]
    broker = ["--bootstrap-servers", kafka.bootstrap]
    assert run_cli(["apply", str(folder), "--yes", *broker], cli_env).returncode == 0
    try:
        deployed = run_cli(
            ["deploy", str(path), *kubeconfig, "--values", str(values), "--timeout", "5m"], cli_env, timeout=420
        )
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        wait_for("the driver pod, ready", lambda: [p for p in pods(cluster, namespace, DRIVER) if ready(p)], 240)
        wait_for(
            "the worker in its share group",
            lambda: describe_share_group(kafka.settings, group, topic).members,
            180,
        )
        assert json.loads(cluster.kubectl("-n", namespace, "get", "queue", name, "-o", "json"))

        path.unlink()
        planned = run_cli(["plan", str(folder), "--detailed-exitcode", *broker], cli_env)
        assert planned.returncode == 4, planned.stdout + planned.stderr
        lines = [" ".join(line.split()) for line in planned.stdout.splitlines()]
        assert f"- release {namespace}/{name} helm uninstall --wait: the worker drains (SIGTERM) and stops" in lines
        queue_object = f"- queue-object {namespace}/{name} goes with release {namespace}/{name} (kubectl get queues)"
        assert queue_object in lines
        assert f"- group {group} deleted with its share-partition state (DeleteGroups)" in lines
        assert any(line.startswith(f"- group-config {group} share.") for line in lines)
        assert any(line.startswith(f"= topic {topic} kept with its data") for line in lines)
        assert any(line.startswith(f"- records {queue}") for line in lines)

        applied = run_cli(["apply", str(folder), "--yes", *kubeconfig, *broker], cli_env, timeout=900)
        assert applied.returncode == 0, applied.stdout + applied.stderr

        status = run_helm(["status", name, "--namespace", namespace], kubeconfig=str(cluster.kubeconfig), check=False)
        assert status.returncode != 0 and "not found" in status.stderr, "the release is uninstalled"
        assert cluster.kubectl("-n", namespace, "get", "queue", name, check=False).strip() == ""
        assert cluster.kubectl("-n", namespace, "get", "deployment", name, check=False).strip() == ""
        assert describe_share_group(kafka.settings, group, topic).state == "Dead", "the group is deleted"
        assert not [k for k, v in read_records(kafka).items() if k == f"acls:{queue}" or v.get("queue") == queue]
        admin = clients.admin(kafka)
        assert topic in admin.list_topics(timeout=10).topics, "deletionPolicy retain keeps the topic"
        again = run_cli(["plan", str(folder), "--detailed-exitcode", *broker], cli_env)
        assert again.returncode == 0 and "No changes." in again.stdout, again.stdout + again.stderr
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
