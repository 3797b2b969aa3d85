"""The streaming query of a consumer-group queue: Spark's Kafka source, the handler per partition.

No shuffle and no ``minPartitions``: the Kafka source makes one Spark partition per Kafka
partition of a micro-batch, and ``mapInArrow`` keeps it whole, so one task sees a partition's
records in offset order. ``maxOffsetsPerTrigger`` bounds a micro-batch.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from queueplane.connection import KafkaTarget
from queueplane.lag import committed_offsets
from queueplane.model import QueueSpec
from queueplane.worker.consumer_runtime import INPUT_COLUMNS, ConsumerSettings, run_partition, transactional_producer
from queueplane.worker.outcomes import OUTCOME_SCHEMA
from queueplane.worker.settings import common_settings
from queueplane.worker.spark_packages import kafka_source

EARLIEST, LATEST = -2, -1  # Spark's startingOffsets JSON spelling


def consumer_settings(queue: QueueSpec, target: KafkaTarget) -> ConsumerSettings:
    slots = 1 if queue.group.ordering == "partition" else queue.concurrency
    return ConsumerSettings(
        **common_settings(queue, target),
        ordering=queue.group.ordering,
        slots=slots,
        # maxInFlight bounds the records a partition has taken but not finished: split over its slots.
        slot_queue=max(1, queue.group.max_in_flight // slots),
        backoff_ms=queue.retry_backoff_ms,
        max_backoff_ms=queue.retry_max_backoff_ms,
        exactly_once=queue.exactly_once,
    )


def fence_partitions(settings: ConsumerSettings, topic: str, partitions: int) -> None:
    """exactlyOnce: abort what a killed worker left open, so the group's offsets can be read at once.

    Until then a read_committed offset fetch waits for the open transaction to time out.
    """
    for partition in range(partitions):
        transactional_producer(settings, topic, partition).flush(1)


def starting_offsets(target: KafkaTarget, queue: QueueSpec) -> str:
    """Where a query without a checkpoint starts: the group's committed offsets, else ``startFrom``."""
    if queue.exactly_once:
        fence_partitions(consumer_settings(queue, target), queue.topic.name, queue.topic.partitions)
    committed = committed_offsets(target, queue.group.id, queue.topic.name, queue.topic.partitions)
    fallback = EARLIEST if queue.group.start_from == "earliest" else LATEST
    per_partition = {
        str(p): committed.get(p) if committed.get(p) is not None else fallback for p in range(queue.topic.partitions)
    }
    return json.dumps({queue.topic.name: per_partition})


def consumer_stream(spark: Any, queue: QueueSpec, target: KafkaTarget, max_batch_records: int | None) -> Any:
    """The outcome rows of a consumer-group queue, as a streaming DataFrame."""
    reader = (
        kafka_source(spark, target, queue.topic.name)
        .option("startingOffsets", starting_offsets(target, queue))
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
    )
    if max_batch_records:
        reader = reader.option("maxOffsetsPerTrigger", str(max_batch_records))
    settings_json = consumer_settings(queue, target).to_json()
    return (
        reader.load()
        .selectExpr(*INPUT_COLUMNS)
        .mapInArrow(functools.partial(run_partition, settings_json), OUTCOME_SCHEMA)
    )
