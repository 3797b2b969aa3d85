"""Where a queue's backlog piles up: hot partitions and hot keys, for `queueplane lag`."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from confluent_kafka import TopicPartition

from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.lag import PartitionLag
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.model import QueueSpec

HOT_PARTITION_FACTOR = 2.0  # a partition holding this many times the mean lag is hot
HOT_MIN_LAG = 100  # below this, skew is noise
HOT_KEY_SHARE = 0.5  # a key holding this share of a partition's sampled backlog is hot
KEY_SAMPLE = 500  # records read from the head of each lagging partition to look for a hot key


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

    def sample(row: PartitionLag) -> list[bytes | None]:
        start = row.committed if row.committed is not None else max(row.log_start, row.log_end - (row.lag or 0))
        wanted = min(KEY_SAMPLE, row.log_end - start)
        consumer = clients.consumer(
            target.settings, {"group.id": kn.lag_sampler_group(queue.group.id), "enable.auto.commit": False}
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
