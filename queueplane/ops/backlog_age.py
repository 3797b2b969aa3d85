"""How long the oldest record a queue's group has not finished has been waiting, in seconds.

A spec states its target lag in seconds (`autoscaling.targetLagSeconds`), so a readiness
check compares time, not record counts: the age of the first unfinished record of each
partition, taken from its own timestamp. For a consumer group (consumer and kmq queues)
that record sits at the committed offset; for a share group at the high watermark minus
the share-partition lag (KIP-1226), never before the share-partition start offset.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from queueplane.kafka import clients
from queueplane.kafka.offsets import LEADER_MOVING, commits_reader, fetch_committed, log_offsets
from queueplane.kafka.protocol import share_partition_offsets
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.model import QueueSpec

READ_TIMEOUT_S = 10.0

# Leaders moving, a topic just created: the answer is unknown this time, not an error.
_SETTLING = {*LEADER_MOVING, KafkaError.UNKNOWN_TOPIC_OR_PART}

Ends = dict[int, tuple[int, int]]  # (log-start, log-end) per partition


def _share_positions(target: KafkaTarget, queue: QueueSpec, ends: Ends) -> dict[int, int] | None:
    if not target.speaks_share_requests():
        return None
    try:
        offsets = share_partition_offsets(target.settings, queue.group.id, queue.topic.name, list(ends))
    except (OSError, ValueError):  # coordinator still loading, broker restarting: unknown this time
        return None
    positions: dict[int, int] = {}
    for p, (low, high) in ends.items():
        start, lag = offsets.get(p, (None, None))
        if start is None:
            # No share-partition state yet: the group starts at startFrom; with "earliest" everything waits.
            if queue.group.start_from == "earliest" and high > low:
                positions[p] = low
        elif lag:
            # The start offset only moves once a whole acquired batch is finished, so records past it may be
            # done already; the lag counts the unfinished ones, taken as the newest: high - lag.
            positions[p] = max(start, high - lag)
    return positions


def _consumer_positions(queue: QueueSpec, ends: Ends, commits: Consumer) -> dict[int, int]:
    committed = fetch_committed(commits, queue.topic.name, range(queue.topic.partitions))
    positions: dict[int, int] = {}
    for p, (low, high) in ends.items():
        at = max(committed.get(p) or 0, low)
        if at < high:
            positions[p] = at
    return positions


class OldestWaiting:
    """The age of the queue's oldest unfinished record, asked again and again (a worker's gauge
    and its Queue status, every few seconds): its clients are kept from one read to the next,
    since making them each time cost the driver and the broker more than the reads. A read that
    fails lets them go; the next one makes new ones."""

    def __init__(self, target: KafkaTarget, queue: QueueSpec):
        self.target, self.queue = target, queue
        self._admin: AdminClient | None = None
        self._commits: Consumer | None = None  # reads the group's commits
        self._records: Consumer | None = None  # reads the first unfinished records' timestamps

    def __call__(self, now: float | None = None) -> float | None:
        """Seconds since the oldest unfinished record was written; 0.0 when nothing waits, None if unknown."""
        try:
            return self._read(now)
        except Exception:
            self.close()
            raise

    def _read(self, now: float | None) -> float | None:
        target, queue = self.target, self.queue
        if self._admin is None:
            self._admin = clients.admin(target)
        try:
            ends = log_offsets(self._admin, queue.topic.name, queue.topic.partitions)
        except KafkaException as exc:
            if exc.args[0].retriable() or exc.args[0].code() in _SETTLING:
                return None
            raise
        if queue.group.type == "share":
            positions = _share_positions(target, queue, ends)
        else:
            if self._commits is None:
                self._commits = commits_reader(target, queue.group.id)
            positions = _consumer_positions(queue, ends, self._commits)
        if positions is None:
            return None
        if not positions:
            return 0.0
        if self._records is None:
            group = f"queueplane-backlog-age-{queue.group.id}"
            self._records = clients.consumer(target.settings, {"group.id": group, "enable.auto.commit": False})
        oldest_ms = _first_timestamps(self._records, queue.topic.name, positions)
        if oldest_ms is None:
            return None
        return max(0.0, (now if now is not None else time.time()) - oldest_ms / 1000)

    def close(self) -> None:
        """Let go of the clients."""
        for client in (self._commits, self._records):
            if client is not None:
                client.close()
        self._admin = self._commits = self._records = None


def _first_timestamps(consumer: Consumer, topic: str, positions: dict[int, int]) -> int | None:
    """The oldest timestamp (ms) of the records at ``positions``; None if none came in time. The
    consumer is left with nothing assigned, so that it fetches nothing until the next read."""
    consumer.assign([TopicPartition(topic, p, at) for p, at in positions.items()])
    try:
        oldest_ms: int | None = None
        waiting = set(positions)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is None or record.error() or record.partition() not in waiting:
                continue
            waiting.discard(record.partition())
            _, stamp = record.timestamp()
            oldest_ms = stamp if oldest_ms is None else min(oldest_ms, stamp)
        return oldest_ms
    finally:
        consumer.unassign()


def oldest_waiting_seconds(target: KafkaTarget, queue: QueueSpec, now: float | None = None) -> float | None:
    """Seconds since the oldest unfinished record was written; 0.0 when nothing waits, None if unknown."""
    reads = OldestWaiting(target, queue)
    try:
        return reads(now)
    finally:
        reads.close()
