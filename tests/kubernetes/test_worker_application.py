"""Three queues of one team in one worker application on the test cluster.

A share, a consumer (exactly once) and a kmq queue name the same
``spec.deployment.application``; `queueplane deploy` with the three specs installs one Helm
release. It runs one driver pod and one executor pool, and each queue keeps its own query,
group, DLQ and Queue object: every queue's load ends accepted or in its own DLQ, and
`kubectl get queues` shows each queue's own lag and dead letters. Deployed again without one
of the specs, the application stops that queue and says so.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml
from helpers import run_cli, tagged_examples, unique_tag, wait_for
from kube_support import DRIVER, EXECUTOR, dlq_records, load, outcomes, pods, restricted_namespace, show

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

APPLICATION = "cafe-workers"
QUEUES = ("queue__cafe__coffee-orders", "queue__payments__payment-events", "queue__messaging__email-jobs")
RECORDS = 300


def _in_one_application(path, namespace: str, minimum: int) -> dict:
    """The example as a queue of team cafe's application, sized for a two-core node."""
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["team"] = "cafe"
    doc["spec"]["deployment"] = {
        "application": APPLICATION,
        "namespace": namespace,
        "image": "registry.example.com/queueplane/worker:0.1.0",
        "executor": {"cores": 1, "memory": "1g"},
    }
    doc["spec"]["autoscaling"] = {"minExecutors": minimum, "maxExecutors": 1, "targetLagSeconds": 30}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


@pytest.mark.timeout(1200)
def test_a_share_a_consumer_and_a_kmq_queue_run_in_one_driver_each_with_its_own_queue_object(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    specs = tagged_examples(tmp_path / "specs", unique_tag())
    namespace = f"cafe-{uuid.uuid4().hex[:6]}"
    # The pool starts at the sum of the minimums: one executor, the share queue's.
    docs = {
        str(specs[dag_id]): _in_one_application(specs[dag_id], namespace, 1 if dag_id == QUEUES[0] else 0)
        for dag_id in QUEUES
    }
    paths = list(docs)
    host = ["--bootstrap-servers", kafka.bootstrap]
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    kube = ["--kubeconfig", str(cluster.kubeconfig)]
    applied = run_cli(["apply", *paths, "--yes", *host], cli_env)
    assert applied.returncode == 0, applied.stderr
    restricted_namespace(cluster, namespace)
    try:
        deployed = run_cli(["deploy", *paths, *kube, "--values", str(values), "--timeout", "8m"], cli_env, timeout=600)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        (driver,) = pods(cluster, namespace, DRIVER)
        assert driver["metadata"]["labels"]["app.kubernetes.io/instance"] == APPLICATION
        args = driver["spec"]["containers"][0]["args"]
        assert args.count("--spec") == 3, args

        poison = {path: load(path, RECORDS, host, cli_env) for path in paths}
        executors_seen: set[str] = set()

        def settled() -> bool:
            executors_seen.update(p["metadata"]["name"] for p in pods(cluster, namespace, EXECUTOR))
            for path, doc in docs.items():
                bad = poison[path]
                if "output" in doc["spec"]["processing"]:
                    ids, dead = outcomes(kafka, doc, RECORDS - bad, bad)
                    if len(ids) < RECORDS - bad or dead < bad:
                        return False
                elif dlq_records(kafka, doc, bad) < bad:
                    return False
            return True

        wait_for("every queue's load to settle", settled, 480)
        for path, doc in docs.items():
            if "output" in doc["spec"]["processing"]:
                ids, dead = outcomes(kafka, doc, RECORDS - poison[path], poison[path])
                assert (len(ids), dead) == (RECORDS - poison[path], poison[path]), doc["metadata"]["name"]
        assert executors_seen, "the queues' tasks ran on executor pods"
        assert len(pods(cluster, namespace, DRIVER)) == 1

        # Each queue reports to its own Queue object: its lag gone and its own dead letters.
        def reported() -> dict | None:
            listed = cluster.kubectl(
                "-n", namespace, "get", "queues", "-l", f"queueplane.io/application={APPLICATION}", "-o", "json"
            )
            shown = {q["metadata"]["name"]: q for q in json.loads(listed)["items"]}
            expected = {doc["metadata"]["name"]: doc for doc in docs.values()}
            if set(shown) != set(expected):
                return None
            for name, queue in shown.items():
                status = queue.get("status", {})
                doc = expected[name]
                if status.get("phase") != "Running" or status.get("lag") != 0:
                    return None
                if status.get("deadLetters") != dlq_records(kafka, doc, 0):
                    return None
            return shown

        shown = wait_for("each Queue object to show its own queue settled", reported, 120)
        for path, doc in docs.items():
            queue = shown[doc["metadata"]["name"]]
            assert queue["spec"] == doc["spec"], "the spec as deployed"
            assert queue["status"]["deadLetters"] >= poison[path], "its own poison, in its own DLQ"

        # The release runs exactly the queues it is given: deployed without the kmq queue's spec,
        # the application stops that queue and says so; the other two run on.
        kept, left_out = paths[:2], docs[paths[2]]["metadata"]["name"]
        again = run_cli(["deploy", *kept, *kube, "--values", str(values), "--timeout", "8m"], cli_env, timeout=600)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"stopped queue(s) {left_out}: application {APPLICATION} ran them" in again.stdout, again.stdout
        listed = cluster.kubectl("-n", namespace, "get", "queues", "-o", "name")
        assert sorted(listed.split()) == sorted(f"queue.queueplane.io/{docs[p]['metadata']['name']}" for p in kept)
        (driver,) = pods(cluster, namespace, DRIVER)
        assert driver["spec"]["containers"][0]["args"].count("--spec") == 2
    except BaseException:
        show(cluster, namespace)
        raise
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
