"""What the Kubernetes tests share: specs sized for the node, pods by label, waits, loads, outcomes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import yaml
from fault_checks import broker_progress
from helpers import run_cli
from worker_support import read_all

from queueplane.kafka import clients
from queueplane.kafka.offsets import end_offsets
from queueplane.run.dead_letters import HEADER_SOURCE_OFFSET, HEADER_SOURCE_PARTITION

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
EXECUTOR = "app.kubernetes.io/component=executor"
DRIVER = "app.kubernetes.io/component=driver"


def sized_for_the_node(path: Path) -> dict:
    """The spec in its own namespace, sized for a two-core node (one executor of one core)."""
    doc = yaml.safe_load(path.read_text())
    namespace = f"{doc['metadata']['team']}-{uuid.uuid4().hex[:6]}"
    doc["spec"]["deployment"] = {**doc["spec"]["deployment"], "namespace": namespace}
    doc["spec"]["deployment"]["executor"] = {"cores": 1, "memory": "1g"}
    doc["spec"]["autoscaling"] = {"minExecutors": 1, "maxExecutors": 1, "targetLagSeconds": 30}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


def pods(cluster, namespace: str, selector: str) -> list[dict]:
    listing = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "json"))
    return listing["items"]


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def restricted_namespace(cluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in RESTRICTED.items()))


def show(cluster, namespace: str) -> None:
    """The pods and the driver's log, for a failed run's report (pytest prints captured output)."""
    print(cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False))
    log = cluster.kubectl("-n", namespace, "logs", "-l", DRIVER, "--tail=80", check=False)
    print("\n".join(line for line in log.splitlines() if "py4j" not in line))


def load(spec: str, count: int, host: list[str], env: dict[str, str]) -> int:
    """Produce ``count`` records, 2% poison; returns how many are poison."""
    loaded = run_cli(["load", spec, "--count", str(count), "--poison-rate", "0.02", "-o", "json", *host], env)
    assert loaded.returncode == 0, loaded.stderr
    return json.loads(loaded.stdout)["poison"]


def _dlq_topic(doc: dict) -> str:
    spec = doc["spec"]
    return spec.get("deadLetter", {}).get("topic", f"{spec['topic']['name']}.dlq")


def dlq_records(kafka, doc: dict, at_least: int) -> int:
    """Every record in the queue's DLQ, duplicates of one dead letter included."""
    return len(read_all(kafka, _dlq_topic(doc), expect_at_least=at_least, timeout_s=5))


def outcomes(kafka, doc: dict, accepted: int, dead: int) -> tuple[set[str], int]:
    """Distinct output ids and distinct dead-lettered records, once at least the expected numbers are there.

    Dead letters are told apart by the source partition and offset in their headers: an executor
    killed between its DLQ write and the broker taking its reject sees the record again and
    writes it again (at least once), and that is still one record put aside.
    """
    dlq = _dlq_topic(doc)
    ids = set(output_ids(kafka, doc, accepted))
    sources = {
        (headers.get(HEADER_SOURCE_PARTITION), headers.get(HEADER_SOURCE_OFFSET))
        for headers in (dict(m.headers() or []) for m in read_all(kafka, dlq, expect_at_least=dead, timeout_s=5))
    }
    return ids, len(sources)


def output_ids(kafka, doc: dict, at_least: int) -> list[str]:
    """Every output's record id as read (read_committed), duplicates included."""
    outputs = read_all(kafka, doc["spec"]["processing"]["output"]["topic"], expect_at_least=at_least, timeout_s=5)
    return [v.get("id") or v.get("order") for v in (json.loads(m.value()) for m in outputs)]


def not_yet_done(kafka, doc: dict) -> int:
    """The records a fault beginning now could catch in flight: per partition, from what the broker
    holds as done for the queue's group (``broker_progress``) to the log's end. The handler runs
    in pods, out of the test's sight, so this counts records not yet fetched too: a bound that is
    only larger than what was in flight, and still finite and of the run."""
    spec = doc["spec"]
    topic, partitions = spec["topic"]["name"], spec["topic"]["partitions"]
    done = broker_progress(kafka, spec["group"]["type"], spec["group"]["id"], topic, partitions)
    ends = end_offsets(clients.admin(kafka), topic, list(range(partitions)))
    return sum(max(0, end - done.get(p, 0)) for p, end in ends.items())
