"""Offsets of a topic and of a group, read the way lag tools read them.

The plumbing under `queueplane lag`, the runtimes' starting points and the DLQ tools: the
log's start and end per partition (ListOffsets) and a group's committed offsets (OffsetFetch,
read_committed), retried through the moments a new broker or group has no coordinator yet.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from queueplane.errors import ACL_HINT, ClusterRefused, ClusterUnreachable, QueueplaneError
from queueplane.kafka import clients
from queueplane.kafka.target import KafkaTarget

REQUEST_TIMEOUT_S = 15.0


class QueueMissing(QueueplaneError):
    """A command reads a queue whose topics were never applied, or were deleted."""


_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._WAIT_COORD,
}

# A partition's leader moving, or not yet elected on a topic just created. The broker's answer per
# partition comes without librdkafka's retriable flag, so the codes are named.
LEADER_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})


def log_offsets(admin: AdminClient, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(log-start, log-end) per partition."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    starts = list_offsets(admin, tps, OffsetSpec.earliest())
    ends = end_offsets(admin, topic, list(range(partitions)))
    return {tp.partition: (starts[tp.partition].offset, ends[tp.partition]) for tp in tps}


def end_offsets(
    admin: AdminClient, topic: str, partitions: list[int], timeout_s: float = REQUEST_TIMEOUT_S
) -> dict[int, int]:
    """The log-end offset of each of ``partitions`` (one ListOffsets request)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    return {p: answer.offset for p, answer in list_offsets(admin, tps, OffsetSpec.latest(), timeout_s).items()}


def list_offsets(
    admin: AdminClient, tps: list[TopicPartition], spec: OffsetSpec, timeout_s: float = REQUEST_TIMEOUT_S
) -> dict[int, Any]:
    """ListOffsets of ``tps`` (one topic's partitions) by partition, asked again while a partition's
    leader moves or is not yet known (a topic just created): retriable errors, up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(1.0, deadline - time.monotonic())
        futures = admin.list_offsets({tp: spec for tp in tps}, request_timeout=left)
        try:
            return {tp.partition: futures[tp].result(left) for tp in tps}
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or time.monotonic() > deadline:
                raise
            if not (error.retriable() or error.code() in LEADER_MOVING):
                raise
            time.sleep(0.2)


def committed_offsets(target: KafkaTarget, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    """The group's committed offsets, waiting for any in an open transaction (read_committed).

    A Consumer's committed() rather than the AdminClient's ListConsumerGroupOffsets: on a
    broker whose offsets topic does not exist yet, the client (2.16.1) crashes in the latter.
    """
    consumer = commits_reader(target, group)
    try:
        return fetch_committed(consumer, topic, range(partitions))
    finally:
        consumer.close()


def commits_reader(target: KafkaTarget | Mapping[str, Any], group: str) -> Consumer:
    """A consumer of ``group`` that only reads its commits (it never subscribes, so it never
    joins), with ``read_committed`` so that it waits for commits in an open transaction."""
    return clients.consumer(target, {"group.id": group, "isolation.level": "read_committed"})


def fetch_committed(consumer: Any, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
    """committed() through the moments a new broker or group has no coordinator yet (retriable errors)."""
    positions = committed_positions(consumer, topic, partitions)
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in positions}


def committed_positions(consumer: Any, topic: str, partitions: Iterable[int]) -> list[TopicPartition]:
    """The group's commits as TopicPartitions (offset and metadata), retried while the coordinator moves."""
    tps = [TopicPartition(topic, p) for p in partitions]
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while True:
        try:
            return consumer.committed(tps, timeout=REQUEST_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in _COORDINATOR_MOVING) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def require_topics(admin: AdminClient, target: KafkaTarget, spec: str, topics: dict[str, str]) -> None:
    """Raise a one-line error naming the first missing topic (``topics``: name -> what it is) and what to run."""
    metadata = admin.list_topics(timeout=REQUEST_TIMEOUT_S)
    for name, what in topics.items():
        if name not in metadata.topics or metadata.topics[name].error is not None:
            error = metadata.topics[name].error if name in metadata.topics else None
            if error is not None and error.name().endswith("AUTHORIZATION_FAILED"):
                refused = f"{spec}: Kafka refused to describe the {what} {name}: {error.name()}"
                raise ClusterRefused(f"{refused}; {ACL_HINT}")
            # An authorizer hides a topic the principal may not describe, as if it did not exist.
            hidden = f" (or the principal {target.principal} may not see it: {ACL_HINT})" if target.principal else ""
            raise QueueMissing(
                f"{spec}: the {what} {name} does not exist on {target.label}{hidden}; "
                f"create the queue's topics with `queueplane apply {spec}`"
            )


def await_queue_topics(target: KafkaTarget, spec: str, topics: dict[str, str], wait_s: float) -> None:
    """``require_topics`` for a worker starting: an unreachable cluster is waited for up to
    ``wait_s`` (a worker started before its broker carries on once the broker is up), then it
    fails in one line; a missing topic fails at once, because waiting would look like an idle queue."""
    deadline = time.monotonic() + wait_s
    admin = clients.admin(target)
    while True:
        try:
            require_topics(admin, target, spec, topics)
            return
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise ClusterUnreachable(
                    f"{spec}: Kafka at {target.label} did not answer within {wait_s:.0f}s ({exc.args[0].str()})"
                ) from None
            time.sleep(2)
