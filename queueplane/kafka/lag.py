"""How far behind a queue's group is, per partition: `queueplane lag`, run summaries, metrics.

Consumer and kmq groups: log-end offset minus the group's committed offset, read with the
AdminClient (ListOffsets, OffsetFetch), the numbers `kafka-consumer-groups --describe` shows.
Share groups: the broker's share-partition lag (KIP-1226), read with DescribeShareGroupOffsets
v1 straight over the Kafka protocol, because the Python client has no call for it. That
path speaks PLAINTEXT only; on a secured listener the lag is reported as unknown (None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from queueplane.kafka import clients
from queueplane.kafka.offsets import commits_reader, committed_offsets, fetch_committed, log_offsets
from queueplane.kafka.protocol import share_partition_offsets
from queueplane.kafka.refused import Refused
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.model import QueueSpec


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


def unread_lag(queue: QueueSpec, log_start: int, log_end: int) -> int:
    """The lag of a partition the group never read: everything retained for ``startFrom: earliest``, else nothing."""
    return log_end - log_start if queue.group.start_from == "earliest" else 0


def share_lag(
    target: KafkaTarget, queue: QueueSpec, offsets: dict[int, tuple[int, int]]
) -> dict[int, int | None] | None:
    """Lag per partition from the broker's share-partition state; None if it cannot be read.

    A partition without state (the group never fetched from it) lags like an unread consumer
    group's; a partition whose state holds no lag yet is None (unknown).
    """
    if not target.speaks_share_requests():
        return None
    try:
        states = share_partition_offsets(target.settings, queue.group.id, queue.topic.name, sorted(offsets))
    except Refused:
        raise  # Kafka said no: not an unknown lag
    except (OSError, ValueError):
        return None
    lags: dict[int, int | None] = {}
    for p, (start, end) in offsets.items():
        state_start, lag = states.get(p, (None, None))
        lags[p] = lag if state_start is not None else unread_lag(queue, start, end)
    return lags


def group_lag(
    target: KafkaTarget, admin: AdminClient, queue: QueueSpec, commits: Consumer | None = None
) -> list[PartitionLag]:
    """Per partition of a consumer or kmq group: log-end, the group's committed offset, the difference.

    A partition the group has not committed yet lags by all it will read: everything
    retained for ``startFrom: earliest``, nothing for ``latest``. ``commits`` is a consumer of
    the group's that never subscribes (``commits_reader``), kept by a caller that asks again
    and again; without one, a consumer is made for this read.
    """
    topic, partitions = queue.topic.name, queue.topic.partitions
    offsets = log_offsets(admin, topic, partitions)
    if commits is None:
        committed = committed_offsets(target, queue.group.id, topic, partitions)
    else:
        committed = fetch_committed(commits, topic, range(partitions))
    rows = []
    for p, (start, end) in sorted(offsets.items()):
        done = committed.get(p)
        lag = unread_lag(queue, start, end) if done is None else max(0, end - max(done, start))
        rows.append(PartitionLag(p, start, end, done, lag))
    return rows


def queue_lag(target: KafkaTarget, queue: QueueSpec, admin: AdminClient | None = None) -> list[PartitionLag]:
    """The lag of every partition of the queue's topic, by the group type's own measure."""
    admin = admin or clients.admin(target)
    if queue.group.type != "share":
        return group_lag(target, admin, queue)
    offsets = log_offsets(admin, queue.topic.name, queue.topic.partitions)
    lags = share_lag(target, queue, offsets) or {}
    return [PartitionLag(p, start, end, None, lags.get(p)) for p, (start, end) in sorted(offsets.items())]


class RemovedUnread:
    """Records retention removed before the group read them (consumer and kmq groups).

    Spark's Kafka source skips them (``failOnDataLoss`` off, so the queue keeps going); they
    are counted here so the loss is reported, never silent. A gap is the log's start offset
    minus the group's committed offset when the start is ahead of it; one gap per partition
    and committed offset, since later reads at the same committed offset can only widen it.
    """

    def __init__(self) -> None:
        self._gaps: dict[tuple[int, int], int] = {}

    def observe(self, rows: list[PartitionLag]) -> None:
        for row in rows:
            if row.committed is not None and row.log_start > row.committed:
                key = (row.partition, row.committed)
                self._gaps[key] = max(self._gaps.get(key, 0), row.log_start - row.committed)

    def total(self) -> int:
        return sum(self._gaps.values())


class BacklogReader:
    """The backlog a worker polls in the background while it runs: the numbers `queueplane lag` shows.

    Calling it reads the lag per partition; a failed read raises (the worker counts Kafka as
    unreachable); None means the backlog cannot be known here (share groups on a listener
    queueplane's protocol client cannot speak). Consumer and kmq reads also count the
    records retention removed unread (``removed``). Share groups have no committed offset to
    compare: the broker delivers what is left.
    """

    def __init__(self, target: KafkaTarget, queue: QueueSpec):
        self.target, self.queue = target, queue
        self.removed = RemovedUnread()
        # Kept from read to read: a client made each second per queue cost the driver and the
        # broker more than the reads themselves (threads, connections, metadata, coordinator).
        self._admin: AdminClient | None = None
        self._commits: Consumer | None = None

    def __call__(self) -> dict[int, int | None] | None:
        queue = self.queue
        if queue.group.type == "share" and not self.target.speaks_share_requests():
            return None
        if self._admin is None:
            self._admin = clients.admin(self.target)
        try:
            if queue.group.type == "share":
                offsets = log_offsets(self._admin, queue.topic.name, queue.topic.partitions)
                lags = share_lag(self.target, queue, offsets)
                if lags is None:
                    raise ConnectionError("the share group's lag could not be read")
                return lags
            if self._commits is None:
                self._commits = commits_reader(self.target, queue.group.id)
            rows = group_lag(self.target, self._admin, queue, self._commits)
        except Exception:
            # A client that lived through a broker restart can keep answering "no leaders"
            # after the broker is back: the next read starts with new ones.
            self.close()
            raise
        self.removed.observe(rows)
        return {row.partition: row.lag for row in rows}

    def close(self) -> None:
        """Let go of the clients; the next read makes new ones."""
        commits, self._commits, self._admin = self._commits, None, None
        if commits is not None:
            commits.close()


def queue_backlog(target: KafkaTarget, queue: QueueSpec) -> BacklogReader:
    return BacklogReader(target, queue)


def total_lag(lags: dict[int, int | None] | None) -> int | None:
    """The sum, or None while any partition's lag is unknown."""
    if lags is None or any(v is None for v in lags.values()):
        return None
    return sum(v for v in lags.values() if v is not None)
