"""The Kafka ACLs a spec's principals need, least privilege, and which of them queueplane made.

A spec names the principal its worker runs as and the principals that may produce to its
queue (``spec.access``). Each gets exactly the ACLs its work needs, on this queue's resources
only. ACLs on a cluster carry no owner, and others may have granted some of the same ones
by hand, so apply records the ACLs it created for each queue (kafka/owners.py); plan deletes
only recorded ones the spec no longer needs, recreates recorded ones deleted behind its back
(drift), and never deletes or records an ACL that existed before queueplane wanted it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from queueplane.kafka import names as kn
from queueplane.spec.model import QueueSpec

Resource = Literal["TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER"]
Operation = Literal["READ", "WRITE", "DESCRIBE_CONFIGS"]
CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW binding from any host: ``principal`` may ``operation`` on ``resource`` ``name``
    (every name starting with it when ``prefixed``)."""

    principal: str
    resource: Resource
    name: str
    operation: Operation
    prefixed: bool = False

    def describe(self) -> str:
        return f"{self.principal} {self.operation} {self.resource}:{self.name}{'*' if self.prefixed else ''}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def wanted_acls(queue: QueueSpec) -> list[Acl]:
    """Every ACL ``queue``'s principals need; none without ``spec.access``.

    READ implies DESCRIBE, and WRITE on a topic is all an idempotent producer needs (Kafka 3.0+).
    """
    out: list[Acl] = []
    worker = queue.worker_principal
    if worker is not None:
        group = queue.group.id
        out += [
            Acl(worker, "TOPIC", queue.topic.name, "READ"),
            # A dead letter the DLQ refuses is parked in the queue's own topic (kmq's tracker
            # also writes its redeliveries there): without it, such a record has nowhere to go.
            Acl(worker, "TOPIC", queue.topic.name, "WRITE"),
            Acl(worker, "GROUP", group, "READ"),
            Acl(worker, "GROUP", kn.spark_reader_group_prefix(group), "READ", prefixed=True),
            Acl(worker, "TOPIC", queue.dead_letter.name, "WRITE"),
            # The worker checks its share-group settings against the broker's bounds.
            Acl(worker, "CLUSTER", CLUSTER_NAME, "DESCRIBE_CONFIGS"),
        ]
        if queue.output_topic:
            out.append(Acl(worker, "TOPIC", queue.output_topic, "WRITE"))
        if queue.markers is not None:
            out += [
                Acl(worker, "TOPIC", queue.markers.name, "READ"),
                Acl(worker, "TOPIC", queue.markers.name, "WRITE"),
                Acl(worker, "GROUP", kn.kmq_tracker_group(group), "READ"),
            ]
        if queue.exactly_once:
            out.append(Acl(worker, "TRANSACTIONAL_ID", kn.transactional_id_prefix(group), "WRITE", prefixed=True))
        # The worker sizes its producers from the max.message.bytes of every topic it writes
        # (kafka/limits.py): unread, they keep librdkafka's 1 MB and refuse records the topics take.
        written = [queue.topic.name, queue.dead_letter.name, queue.output_topic, queue.markers and queue.markers.name]
        out += [Acl(worker, "TOPIC", topic, "DESCRIBE_CONFIGS") for topic in written if topic]
    out += [Acl(p, "TOPIC", queue.topic.name, "WRITE") for p in queue.producer_principals]
    return sorted(set(out))


@dataclass(frozen=True)
class AclChanges:
    """What one queue's ACLs need: created, deleted, and the record apply leaves behind."""

    create: list[Acl]
    drifted: list[Acl]  # in ``create``: made by queueplane once, deleted since
    delete: list[Acl]
    record: list[Acl]


def acl_changes(wanted: list[Acl], live: set[Acl], recorded: set[Acl]) -> AclChanges:
    """Create what is wanted and missing; delete what was recorded, is no longer wanted and is
    still there; record what is wanted and either was recorded or is about to be created (an
    ACL someone else had already granted stays theirs)."""
    want = set(wanted)
    create = sorted(want - live)
    drifted = sorted(a for a in create if a in recorded)
    delete = sorted((recorded - want) & live)
    record = sorted((recorded & want) | set(create))
    return AclChanges(create, drifted, delete, record)
