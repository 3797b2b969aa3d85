"""The typed view of a valid spec, with every default resolved.

Only validated documents become a QueueSpec, so the rest of the code can trust the
types here and never re-check the raw YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from queueplane.kafka import names as kn
from queueplane.spec import durations
from queueplane.spec.schema import apply_defaults

GroupType = Literal["consumer", "share", "kmq"]
DeletionPolicy = Literal["retain", "delete"]
Ordering = Literal["none", "partition", "key"]


def config_value(value: Any) -> str:
    """Kafka config values are strings; spec numbers and booleans become their Kafka spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int | None
    config: dict[str, str] = field(default_factory=dict)
    # Take the topic over although no queueplane spec created it (see kafka/owners.py).
    adopt: bool = False


# Deliveries the broker allows beyond a share spec's deliveryLimit: see GroupSpec.broker_delivery_limit.
SHARE_RESERVE_DELIVERIES = 2


@dataclass(frozen=True)
class GroupSpec:
    type: GroupType
    id: str
    lock_duration_ms: int
    delivery_limit: int
    max_in_flight: int
    ordering: Ordering
    start_from: str

    @property
    def broker_delivery_limit(self) -> int:
        """The share group's ``share.delivery.count.limit``: ``SHARE_RESERVE_DELIVERIES`` beyond ``deliveryLimit``.

        The broker archives a record whose last allowed delivery ends without an acknowledgement
        (its lock ran out: the worker was killed) or with a RELEASE (its DLQ write failed), and an
        archived record is in neither the output nor the DLQ. With deliveries in reserve the
        broker does not decide: the worker runs the handler ``deliveryLimit`` times and sends the
        record to the DLQ on the first reserve delivery (see run/share/executor/fetcher.py). Two, because
        a process that dies costs every record it holds a delivery, and the broker acquires whole
        producer batches, so a record held by two dying processes in a row loses its last
        delivery and a single reserve delivery both (docs/runtimes.md has the CI run).
        """
        return self.delivery_limit + SHARE_RESERVE_DELIVERIES


@dataclass(frozen=True)
class QueueSpec:
    """One validated queue spec. ``source`` is the file it came from (for messages)."""

    source: str
    name: str
    team: str
    description: str
    topic: TopicSpec
    group: GroupSpec
    dead_letter: TopicSpec
    markers: TopicSpec | None
    output_topic: str | None
    handler: str
    concurrency: int
    exactly_once: bool
    memory_limit: str | None  # processing.memoryLimit as written; handler_memory_mi has the default
    retry_backoff_ms: int
    retry_max_backoff_ms: int
    min_executors: int
    max_executors: int
    target_lag_seconds: int
    deploy_target: str  # "kubernetes" or "spark-submit"
    application: str  # the worker application (Helm release) it runs in; default: its own name
    namespace: str
    image: str | None
    driver: dict[str, Any]
    executor: dict[str, Any]
    document: dict[str, Any]
    # spec.access: who the worker runs as and who may produce (ACLs, see provision/acls.py)
    worker_principal: str | None = None
    producer_principals: tuple[str, ...] = ()
    # processing.setup and processing.teardown: module:function, run once per worker process
    setup: str | None = None
    teardown: str | None = None
    # spec.deletionPolicy: whether removing the spec deletes its topics (provision/removal in plan.py)
    deletion_policy: DeletionPolicy = "retain"

    def memory_mi(self, role: str) -> int:
        """``deployment.<role>.memory`` (driver or executor) in MiB: the schema allows ``<n>m`` or ``<n>g``."""
        text = str((self.driver if role == "driver" else self.executor).get("memory", "1g"))
        return memory_mi(text)

    @property
    def handler_memory_mi(self) -> int:
        """``processing.memoryLimit`` in MiB: what one handler process may hold (default: the executor's memory)."""
        return memory_mi(self.memory_limit) if self.memory_limit else self.memory_mi("executor")

    @property
    def handler_search_paths(self) -> list[str]:
        """Where the handler and its hooks are imported from, before sys.path: the spec's folder
        (a handler package beside the spec) and its parent (the team folder the spec sits in is the
        package: specs/<team>/__init__.py makes ``<team>.handlers`` importable)."""
        folder = Path(self.source).resolve().parent
        return [str(folder), str(folder.parent)]

    @property
    def owner(self) -> str:
        """``team/name``: the queue's identity in the topics' owner records."""
        return f"{self.team}/{self.name}"

    def owned_topics(self) -> list[tuple[str, str]]:
        """(pointer, topic) pairs for every topic this spec creates and manages."""
        owned = [("/spec/topic/name", self.topic.name), ("/spec/deadLetter/topic", self.dead_letter.name)]
        if self.markers:
            owned.append(("/spec/markers/topic", self.markers.name))
        return owned


def memory_mi(text: str) -> int:
    """A spec's memory size (``512m``, ``2g``) in MiB."""
    return int(text[:-1]) * (1024 if text.endswith("g") else 1)


def build(document: dict[str, Any], source: str) -> QueueSpec:
    """Turn a schema-valid document into a QueueSpec (defaults from the schema)."""
    d = apply_defaults(document)
    meta, spec = d["metadata"], d["spec"]
    topic_doc, group_doc = spec["topic"], spec["group"]
    topic = TopicSpec(
        name=topic_doc["name"],
        partitions=topic_doc["partitions"],
        replication_factor=topic_doc.get("replicationFactor"),
        config={k: config_value(v) for k, v in topic_doc["config"].items()},
        adopt=topic_doc["adopt"],
    )
    group = GroupSpec(
        type=group_doc["type"],
        id=group_doc["id"],
        lock_duration_ms=durations.parse_ms(group_doc["lockDuration"]),
        delivery_limit=group_doc["deliveryLimit"],
        max_in_flight=group_doc["maxInFlight"],
        ordering=group_doc["ordering"],
        start_from=group_doc["startFrom"],
    )
    dlq_doc = spec["deadLetter"]
    dead_letter = TopicSpec(
        name=dlq_doc.get("topic", f"{topic.name}.dlq"),
        partitions=dlq_doc.get("partitions", topic.partitions),
        replication_factor=topic.replication_factor,
        config={k: config_value(v) for k, v in dlq_doc.get("config", {}).items()},
        adopt=dlq_doc["adopt"],
    )
    markers = None
    if group.type == "kmq":
        markers_doc = spec["markers"]
        markers = TopicSpec(
            name=markers_doc.get("topic", f"{topic.name}.markers"),
            partitions=topic.partitions,
            replication_factor=topic.replication_factor,
            config={
                kn.RETENTION_MS: str(durations.parse_ms(markers_doc["retention"])),
                kn.CLEANUP_POLICY: "delete",
            },
            adopt=markers_doc["adopt"],
        )
    processing = spec["processing"]
    deployment = spec["deployment"]
    return QueueSpec(
        source=source,
        name=meta["name"],
        team=meta["team"],
        description=meta.get("description", ""),
        topic=topic,
        group=group,
        dead_letter=dead_letter,
        markers=markers,
        output_topic=processing.get("output", {}).get("topic"),
        handler=processing["handler"],
        concurrency=processing["concurrency"],
        exactly_once=processing["exactlyOnce"],
        memory_limit=processing.get("memoryLimit"),
        retry_backoff_ms=durations.parse_ms(spec["retry"]["backoff"]),
        retry_max_backoff_ms=durations.parse_ms(spec["retry"]["maxBackoff"]),
        min_executors=spec["autoscaling"]["minExecutors"],
        max_executors=spec["autoscaling"]["maxExecutors"],
        target_lag_seconds=spec["autoscaling"]["targetLagSeconds"],
        deploy_target=deployment["target"],
        application=deployment.get("application", meta["name"]),
        namespace=deployment.get("namespace", meta["team"]),
        image=deployment.get("image"),
        driver=deployment["driver"],
        executor=deployment["executor"],
        document=d,
        worker_principal=spec.get("access", {}).get("worker"),
        producer_principals=tuple(spec.get("access", {}).get("producers", [])),
        setup=processing.get("setup"),
        teardown=processing.get("teardown"),
        deletion_policy=spec.get("deletionPolicy", "retain"),
    )
