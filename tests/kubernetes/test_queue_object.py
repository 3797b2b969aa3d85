"""The cluster's Queue object holds the spec as deployed beside its status; a spec applied by hand is refused.

`queueplane deploy` brings the Queue definition and its admission policy up to the chart's
(here: a definition marked stale first), then installs the release. Its Queue object's spec is
the spec file's `spec` as written; the driver reports its status through the status
subresource and the spec stays as deployed; `kubectl get queues` shows the team and group
type. A spec file applied with kubectl is refused: by the API server's strict field check,
which names `metadata.team` (no Kubernetes field), and with that check off by the admission
policy, whose message says to commit the spec and run its DAG, for a new Queue and for the
deployed one, whose spec stays as deployed. A deploy of the changed spec changes it.
"""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
import yaml
from helpers import run_cli, tagged_examples, unique_tag, wait_for
from kube_support import restricted_namespace, show, sized_for_the_node

from queueplane.deploy.definitions import DIGEST_ANNOTATION, definition_digest
from queueplane.deploy.render import chart_cluster_objects

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]

CRD = "queues.queueplane.io"
DIRECTIONS = "run its DAG (queue__<team>__<name>), or run `queueplane deploy SPEC`"


def _kubectl(cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cluster.kubectl_command(*args), capture_output=True, text=True, timeout=120)


def _queue(cluster, namespace: str, name: str) -> dict:
    return json.loads(cluster.kubectl("-n", namespace, "get", "queue", name, "-o", "json"))


@pytest.mark.timeout(900)
def test_the_queue_object_holds_the_deployed_spec_beside_its_status_and_refuses_a_hand_applied_spec(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    name, team, namespace = doc["metadata"]["name"], doc["metadata"]["team"], doc["spec"]["deployment"]["namespace"]
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    deploy = ["deploy", str(path), "--kubeconfig", str(cluster.kubeconfig), "--values", str(values)]
    assert run_cli(["apply", str(path), "--yes", "--bootstrap-servers", kafka.bootstrap], cli_env).returncode == 0
    restricted_namespace(cluster, namespace)
    # A cluster whose definition an older chart wrote: the deploy replaces it.
    crd_there = _kubectl(cluster, "get", "crd", CRD).returncode == 0
    if crd_there:
        cluster.kubectl("annotate", "crd", CRD, f"{DIGEST_ANNOTATION}=stale", "--overwrite")
    try:
        first = run_cli([*deploy, "--timeout", "5m"], cli_env, timeout=420)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"{'updated' if crd_there else 'created'} CustomResourceDefinition {CRD}" in first.stdout, first.stdout
        for obj in chart_cluster_objects():
            kind = {"CustomResourceDefinition": "crd"}.get(obj["kind"], obj["kind"].lower())
            live = json.loads(cluster.kubectl("get", kind, obj["metadata"]["name"], "-o", "json"))
            assert live["metadata"]["annotations"][DIGEST_ANNOTATION] == definition_digest(obj), obj["kind"]

        # The object holds the spec file's spec, as written: no defaults, no other fields.
        queue = _queue(cluster, namespace, name)
        written = yaml.safe_load(path.read_text())["spec"]
        assert queue["spec"] == written
        assert queue["metadata"]["labels"]["queueplane.io/team"] == team
        assert queue["metadata"]["annotations"]["meta.helm.sh/release-name"] == name

        # The driver's reports land in the status, and never touch the spec.
        def reported() -> dict | None:
            shown = _queue(cluster, namespace, name)
            status = shown.get("status", {})
            return shown if status.get("phase") == "Running" and status.get("updated") else None

        queue = wait_for("the driver's status report", reported, 300)
        first_report = queue["status"]["updated"]
        queue = wait_for(
            "a later report",
            lambda: (q := _queue(cluster, namespace, name))["status"]["updated"] != first_report and q,
            60,
        )
        assert queue["spec"] == written and queue["metadata"]["generation"] == 1, "status reports leave the spec"
        header, *rows = cluster.kubectl("-n", namespace, "get", "queues").splitlines()
        assert header.split()[:3] == ["NAME", "TEAM", "TYPE"] and rows[0].split()[:3] == [name, team, "share"], rows

        # The spec file applied by hand, changed: kubectl's strict field check refuses it first...
        hand = copy.deepcopy(yaml.safe_load(path.read_text()))
        concurrency = doc["spec"]["processing"]["concurrency"] + 4
        hand["spec"]["processing"]["concurrency"] = concurrency
        hand_file = tmp_path / "by-hand.yaml"
        hand_file.write_text(yaml.safe_dump(hand, sort_keys=False))
        strict = _kubectl(cluster, "-n", namespace, "apply", "-f", str(hand_file))
        assert strict.returncode != 0 and 'unknown field "metadata.team"' in strict.stderr, strict.stderr

        # ...and with it off, the admission policy: over the deployed Queue, which keeps its spec,
        loose = _kubectl(cluster, "-n", namespace, "apply", "--validate=false", "-f", str(hand_file))
        assert loose.returncode != 0, loose.stdout
        said = " ".join(loose.stderr.split())
        assert "(Forbidden)" in said and "denied request" in said, said
        assert "A deployed Queue's spec changes only with its release" in said and DIRECTIONS in said, said
        assert _queue(cluster, namespace, name)["spec"] == written

        # ...and as a new Queue, which is never made.
        hand["metadata"]["name"] = "made-by-hand"
        hand_file.write_text(yaml.safe_dump(hand, sort_keys=False))
        new = _kubectl(cluster, "-n", namespace, "apply", "--validate=false", "-f", str(hand_file))
        said = " ".join(new.stderr.split())
        assert new.returncode != 0 and "(Forbidden)" in said, said
        assert "Queue objects are made by queueplane's deploy" in said and DIRECTIONS in said, said
        assert _kubectl(cluster, "-n", namespace, "get", "queue", "made-by-hand").returncode != 0

        # The changed spec, deployed: the object's spec follows (the policy admits a deploy's change).
        doc["spec"]["processing"]["concurrency"] = concurrency
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        again = run_cli([*deploy, "--timeout", "5m"], cli_env, timeout=420)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "CustomResourceDefinition" not in again.stdout, "a current definition is left alone"
        queue = _queue(cluster, namespace, name)
        assert queue["spec"] == yaml.safe_load(path.read_text())["spec"]
        assert queue["spec"]["processing"]["concurrency"] == concurrency and queue["metadata"]["generation"] == 2
    except BaseException:
        show(cluster, namespace)
        raise
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
