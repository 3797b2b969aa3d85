"""A queue at a glance, for `queueplane status`: Kafka's view, and the cluster's when asked.

Everything here is read-only and tolerates a queue that is not (fully) there yet: a missing
topic or group is a state to show, not an error, so a new user sees what to run next.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from queueplane.deploy.helm import HelmError, run_helm
from queueplane.deploy.kube_access import KubeAccess, kube_client
from queueplane.kafka import clients
from queueplane.kafka.lag import queue_lag, total_lag
from queueplane.kafka.protocol import describe_share_group
from queueplane.kafka.target import KafkaTarget
from queueplane.ops import dlq
from queueplane.ops.backlog_age import OldestWaiting, oldest_waiting_seconds
from queueplane.run.driver.queue_status import QueueReads
from queueplane.spec.model import QueueSpec

MISSING = "missing"


@dataclass(frozen=True)
class Member:
    client_id: str
    host: str
    partitions: list[int]


@dataclass
class QueueStatus:
    queue: str
    team: str
    group_type: str
    topic: str
    partitions: int | None  # None: the topic does not exist (not applied yet)
    group: str
    group_state: str  # Kafka's (Empty, Stable, ...), "Dead" for a group never joined, or "unknown"
    members: list[Member] = field(default_factory=list)
    lag: int | None = None
    oldest_waiting_s: float | None = None
    dead_letter_topic: str = ""
    dead_letters: int | None = None  # pending after the redrive position, by offsets
    release: dict[str, Any] | None = None  # helm's view, when a cluster was named
    pods: list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _existing(admin: AdminClient, topics: list[str]) -> dict[str, int]:
    listed = admin.list_topics(timeout=15).topics
    return {t: len(listed[t].partitions) for t in topics if t in listed and listed[t].error is None}


def _consumer_group(admin: AdminClient, queue: QueueSpec) -> tuple[str, list[Member]]:
    try:
        described = admin.describe_consumer_groups([queue.group.id], request_timeout=15)[queue.group.id].result()
    except KafkaException as exc:
        code = exc.args[0].code()
        # A group never joined: the broker answers "not found", or "not coordinator" when no
        # coordinator has loaded it. Anything else (authorization, ...) is shown, not hidden.
        if code in (KafkaError.GROUP_ID_NOT_FOUND, KafkaError.NOT_COORDINATOR):
            return ConsumerGroupState.DEAD.name.title(), []
        return f"unknown ({exc.args[0].name()})", []
    members = [
        Member(
            m.client_id,
            m.host,
            sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == queue.topic.name),
        )
        for m in described.members
    ]
    return described.state.name.title().replace("_", ""), members


def _share_group(target: KafkaTarget, queue: QueueSpec) -> tuple[str, list[Member]]:
    if not target.speaks_share_requests():
        return "unknown", []
    try:
        group = describe_share_group(target.settings, queue.group.id, queue.topic.name)
    except (OSError, ValueError):
        return "unknown", []
    return group.state, [Member(m.client_id, m.client_host, list(m.partitions)) for m in group.members]


def queue_reads(target: KafkaTarget, queue: QueueSpec) -> QueueReads:
    """The reads a watched worker makes every few seconds (its gauges, its Queue status)."""
    return QueueReads(
        oldest_seconds=OldestWaiting(target, queue),
        dead_letters=dlq.DeadLetterCounter(target, queue),
    )


def kafka_status(target: KafkaTarget, queue: QueueSpec) -> QueueStatus:
    """The topic, the group and its members, lag and the oldest wait, and the DLQ's pending count."""
    admin = clients.admin(target)
    existing = _existing(admin, [queue.topic.name, queue.dead_letter.name])
    if queue.group.type == "share":
        state, members = _share_group(target, queue)
    else:
        state, members = _consumer_group(admin, queue)
    status = QueueStatus(
        queue=queue.name,
        team=queue.team,
        group_type=queue.group.type,
        topic=queue.topic.name,
        partitions=existing.get(queue.topic.name),
        group=queue.group.id,
        group_state=state,
        members=members,
        dead_letter_topic=queue.dead_letter.name,
    )
    if status.partitions is not None:
        status.lag = total_lag({r.partition: r.lag for r in queue_lag(target, queue, admin)})
        status.oldest_waiting_s = oldest_waiting_seconds(target, queue)
    if queue.dead_letter.name in existing:
        status.dead_letters = dlq.pending_by_offsets(target, queue)
    return status


def kubernetes_status(status: QueueStatus, queue: QueueSpec, access: KubeAccess) -> None:
    """The Helm release of the queue's application (helm status) and its pods (driver, executors)."""
    release, namespace = queue.application, queue.namespace  # as render names the release
    args = ["status", release, "--namespace", namespace, "-o", "json"]
    if access.context:
        args += ["--kube-context", access.context]
    try:
        shown = json.loads(run_helm(args, kubeconfig=access.kubeconfig, timeout=60).stdout)
    except HelmError as exc:
        if "not found" not in str(exc):
            raise
        status.release = {"name": release, "namespace": namespace, "status": MISSING}
    else:
        info = shown.get("info", {})
        status.release = {
            "name": release,
            "namespace": namespace,
            "status": info.get("status"),
            "revision": shown.get("version"),
            "updated": info.get("last_deployed"),
        }
    status.pods = _pods(access, namespace, queue.application)


def _pods(access: KubeAccess, namespace: str, application: str) -> list[dict[str, Any]]:
    from kubernetes import client

    with kube_client(access) as api:
        listed = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"queueplane.io/application={application}"
        )
    pods = []
    for pod in listed.items:
        containers = pod.status.container_statuses or []
        pods.append(
            {
                "name": pod.metadata.name,
                "component": (pod.metadata.labels or {}).get("app.kubernetes.io/component", ""),
                "phase": pod.status.phase,
                "ready": bool(containers) and all(c.ready for c in containers),
                "restarts": sum(c.restart_count for c in containers),
            }
        )
    return sorted(pods, key=lambda p: (p["component"], p["name"]))
