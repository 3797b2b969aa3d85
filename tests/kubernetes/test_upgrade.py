"""Helm upgrades of a deployed queue, with `queueplane deploy` (helm upgrade --install --rollback-on-failure).

A changed spec rolls the driver: a new pod with the new spec replaces the old one. An upgrade
to an image that cannot start fails, helm rolls the release back, and a share queue's worker
runs on throughout: its Deployment starts the new driver beside the old one and never stops
the old one, since the new one never gets ready.
"""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import run_cli, tagged_examples, unique_tag, wait_for
from kube_support import DRIVER, load, outcomes, pods, ready, restricted_namespace, show, sized_for_the_node

from queueplane.deploy.helm import run_helm

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]


def _history(cluster, release: str, namespace: str) -> list[dict]:
    listing = run_helm(
        ["history", release, "--namespace", namespace, "--output", "json"], kubeconfig=str(cluster.kubeconfig)
    )
    return json.loads(listing.stdout)


@pytest.mark.timeout(900)
def test_a_changed_spec_rolls_the_driver_and_a_broken_image_rolls_back_while_the_old_worker_runs(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    release, namespace = doc["metadata"]["name"], doc["spec"]["deployment"]["namespace"]
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    host = ["--bootstrap-servers", kafka.bootstrap]
    deploy = ["deploy", str(path), "--kubeconfig", str(cluster.kubeconfig), "--values", str(values)]
    assert run_cli(["apply", str(path), "--yes", *host], cli_env).returncode == 0
    restricted_namespace(cluster, namespace)
    try:
        first = run_cli([*deploy, "--timeout", "5m"], cli_env, timeout=420)
        assert first.returncode == 0, first.stdout + first.stderr
        (old,) = pods(cluster, namespace, DRIVER)

        # The spec changes (more handler slots per executor): the driver is rolled.
        doc["spec"]["processing"]["concurrency"] = doc["spec"]["processing"]["concurrency"] + 4
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        second = run_cli([*deploy, "--timeout", "5m"], cli_env, timeout=420)
        assert second.returncode == 0, second.stdout + second.stderr
        (rolled,) = wait_for(
            "the old driver gone and one new driver",
            lambda: (found := pods(cluster, namespace, DRIVER)) and len(found) == 1 and found,
            180,
        )
        assert rolled["metadata"]["name"] != old["metadata"]["name"] and ready(rolled)
        mounted = cluster.kubectl(
            "-n",
            namespace,
            "exec",
            rolled["metadata"]["name"],
            "--",
            "cat",
            f"/etc/queueplane/spec/{doc['metadata']['name']}.yaml",
        )
        assert yaml.safe_load(mounted)["spec"]["processing"]["concurrency"] == doc["spec"]["processing"]["concurrency"]

        # An image that cannot start: helm gives up after its timeout and rolls back.
        broken = cluster.values(pod_kafka.pod_bootstrap)
        broken["image"]["tag"] = "no-such-tag"
        broken_file = tmp_path / "broken-values.yaml"
        broken_file.write_text(yaml.safe_dump(broken))
        third = run_cli([*deploy, "--values", str(broken_file), "--timeout", "45s"], cli_env, timeout=300)
        assert third.returncode == 1, third.stdout + third.stderr
        assert "rollback" in (third.stdout + third.stderr).lower(), third.stderr
        history = _history(cluster, release, namespace)
        assert [entry["status"] for entry in history][-2:] == ["failed", "deployed"], history
        assert history[-1]["description"].startswith("Rollback to 2"), history[-1]
        (survivor,) = wait_for(
            "the broken driver pod removed",
            lambda: (found := pods(cluster, namespace, DRIVER)) and len(found) == 1 and found,
            120,
        )
        assert survivor["metadata"]["name"] == rolled["metadata"]["name"], "the old worker was never stopped"
        assert survivor["status"]["containerStatuses"][0]["restartCount"] == 0

        # ...and it still does its work.
        poison = load(str(path), 200, host, cli_env)
        wait_for(
            "a load handled by the surviving worker",
            lambda: (o := outcomes(kafka, doc, 200 - poison, poison)) and len(o[0]) >= 200 - poison and o[1] >= poison,
            300,
        )
    except BaseException:
        show(cluster, namespace)
        raise
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
