"""How far behind a queue's group is, per partition: `queueplane lag`, run summaries, metrics.

Consumer and kmq groups: log-end offset minus the group's committed offset, read with the
AdminClient (ListOffsets, OffsetFetch), the numbers `kafka-consumer-groups --describe` shows.
Share groups: the broker's share-partition lag (KIP-1226), read with DescribeShareGroupOffsets
v1 straight over the Kafka protocol, because the Python client has no call for it. That
path speaks PLAINTEXT only; on a secured listener the lag is reported as unknown (None).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from queueplane.connection import KafkaTarget
from queueplane.kafka_protocol import share_partition_lag
from queueplane.model import QueueSpec

REQUEST_TIMEOUT_S = 15.0
HOT_PARTITION_FACTOR = 2.0  # a partition holding this many times the mean lag is hot
HOT_MIN_LAG = 100  # below this, skew is noise
HOT_KEY_SHARE = 0.5  # a key holding this share of a partition's sampled backlog is hot
KEY_SAMPLE = 500  # records read from the head of each lagging partition to look for a hot key


_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._WAIT_COORD,
}


@dataclass
class PartitionLag:
    partition: int
    log_start: int
    log_end: int
    committed: int | None  # None: the group has committed nothing for it (share groups: never shown)
    lag: int | None
    hot_partition: bool = False
    hot_key: str | None = None
    hot_key_share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _plaintext_bootstrap(target: KafkaTarget) -> tuple[str, int] | None:
    if target.settings.get("security.protocol", "plaintext").lower() != "plaintext":
        return None
    first = target.bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def share_lag(target: KafkaTarget, group: str, topic: str, partitions: int) -> dict[int, int | None] | None:
    """Lag per partition (None where the broker has no state for it yet); None if it cannot be read."""
    address = _plaintext_bootstrap(target)
    if address is None:
        return None
    try:
        lags = share_partition_lag(address[0], address[1], group, topic, list(range(partitions)))
    except (OSError, ValueError):
        return None
    return lags


def admin_client(target: KafkaTarget) -> AdminClient:
    from queueplane.cluster import quiet_logger

    return AdminClient({**target.settings, "logger": quiet_logger()})


def log_offsets(admin: AdminClient, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(log-start, log-end) per partition."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=REQUEST_TIMEOUT_S)
    starts = admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps}, request_timeout=REQUEST_TIMEOUT_S)
    return {
        tp.partition: (
            starts[tp].result(REQUEST_TIMEOUT_S).offset,
            ends[tp].result(REQUEST_TIMEOUT_S).offset,
        )
        for tp in tps
    }


def committed_offsets(target: KafkaTarget, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    """The group's committed offsets, waiting for any in an open transaction (read_committed).

    A Consumer's committed() rather than the AdminClient's ListConsumerGroupOffsets: on a
    broker whose offsets topic does not exist yet, the client (2.16.1) crashes in the latter.
    """
    from confluent_kafka import Consumer

    from queueplane.cluster import quiet_logger

    consumer = Consumer(
        {**target.settings, "group.id": group, "isolation.level": "read_committed", "logger": quiet_logger()}
    )
    try:
        return fetch_committed(consumer, topic, range(partitions))
    finally:
        consumer.close()


def fetch_committed(consumer: Any, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
    """committed() through the moments a new broker or group has no coordinator yet (retriable errors)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while True:
        try:
            result = consumer.committed(tps, timeout=REQUEST_TIMEOUT_S)
            return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in _COORDINATOR_MOVING) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def group_lag(target: KafkaTarget, admin: AdminClient, queue: QueueSpec) -> list[PartitionLag]:
    """Per partition of a consumer or kmq group: log-end, the group's committed offset, the difference.

    A partition the group has not committed yet lags by all it will read: everything
    retained for ``startFrom: earliest``, nothing for ``latest``.
    """
    topic, partitions = queue.topic.name, queue.topic.partitions
    offsets = log_offsets(admin, topic, partitions)
    committed = committed_offsets(target, queue.group.id, topic, partitions)
    rows = []
    for p, (start, end) in sorted(offsets.items()):
        done = committed.get(p)
        if done is None:
            lag = end - start if queue.group.start_from == "earliest" else 0
        else:
            lag = max(0, end - max(done, start))
        rows.append(PartitionLag(p, start, end, done, lag))
    return rows


def queue_lag(target: KafkaTarget, queue: QueueSpec, admin: AdminClient | None = None) -> list[PartitionLag]:
    """The lag of every partition of the queue's topic, by the group type's own measure."""
    admin = admin or admin_client(target)
    if queue.group.type != "share":
        return group_lag(target, admin, queue)
    offsets = log_offsets(admin, queue.topic.name, queue.topic.partitions)
    lags = share_lag(target, queue.group.id, queue.topic.name, queue.topic.partitions) or {}
    return [PartitionLag(p, start, end, None, lags.get(p)) for p, (start, end) in sorted(offsets.items())]


def flag_skew(rows: list[PartitionLag], sample_keys: Callable[[PartitionLag], list[bytes | None]] | None) -> None:
    """Mark hot partitions (far above the mean lag) and, where keys are sampled, a key owning a partition's backlog."""
    known = [r.lag for r in rows if r.lag is not None]
    mean = sum(known) / len(known) if known else 0
    for row in rows:
        lag = row.lag or 0
        row.hot_partition = len(rows) > 1 and lag >= HOT_MIN_LAG and lag >= HOT_PARTITION_FACTOR * mean
        if sample_keys is None or lag < HOT_MIN_LAG:
            continue
        keys = sample_keys(row)
        if not keys:
            continue
        key, count = Counter(keys).most_common(1)[0]
        share = count / len(keys)
        if share >= HOT_KEY_SHARE:
            row.hot_key = "(no key)" if key is None else key.decode("utf-8", "replace")
            row.hot_key_share = round(share, 3)


def key_sampler(target: KafkaTarget, queue: QueueSpec) -> Callable[[PartitionLag], list[bytes | None]]:
    """Keys of the first records of a partition's backlog (from its committed offset), to spot a hot key."""
    from confluent_kafka import Consumer

    from queueplane.cluster import quiet_logger

    def sample(row: PartitionLag) -> list[bytes | None]:
        start = row.committed if row.committed is not None else max(row.log_start, row.log_end - (row.lag or 0))
        wanted = min(KEY_SAMPLE, row.log_end - start)
        consumer = Consumer(
            {
                **target.settings,
                "group.id": f"{queue.group.id}.lag-sampler",
                "enable.auto.commit": False,
                "logger": quiet_logger(),
            }
        )
        keys: list[bytes | None] = []
        try:
            consumer.assign([TopicPartition(queue.topic.name, row.partition, start)])
            deadline = time.monotonic() + 5
            while len(keys) < wanted and time.monotonic() < deadline:
                for message in consumer.consume(min(500, wanted - len(keys)), 0.5):
                    if not message.error():
                        keys.append(message.key())
        finally:
            consumer.close()
        return keys

    return sample


def queue_backlog(target: KafkaTarget, queue: QueueSpec) -> Callable[[], dict[int, int | None] | None]:
    """The backlog reader a worker polls once per micro-batch: the same numbers `queueplane lag` shows."""
    if queue.group.type == "share":
        return lambda: share_lag(target, queue.group.id, queue.topic.name, queue.topic.partitions)
    admin: list[AdminClient] = []

    def read() -> dict[int, int | None] | None:
        if not admin:
            admin.append(admin_client(target))
        try:
            return {row.partition: row.lag for row in group_lag(target, admin[0], queue)}
        except Exception:
            return None

    return read


def total_lag(lags: dict[int, int | None] | None) -> int | None:
    """The sum, or None while any partition's lag is unknown."""
    if lags is None or any(v is None for v in lags.values()):
        return None
    return sum(v for v in lags.values() if v is not None)
