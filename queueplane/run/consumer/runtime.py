"""Consumer groups on the driver: Spark's Kafka source, the handler per partition, offsets kept safe.

No shuffle and no ``minPartitions``: the Kafka source makes one Spark partition per Kafka
partition of a micro-batch, and ``mapInArrow`` keeps it whole, so one task sees a partition's
records in offset order (``partition.py``). ``maxOffsetsPerTrigger`` bounds a micro-batch.
"""

from __future__ import annotations

import functools
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from queueplane.kafka.target import KafkaTarget
from queueplane.run.consumer.partition import run_partition
from queueplane.run.consumer.process import ConsumerSettings, transactional_producer
from queueplane.run.kafka_input import INPUT_COLUMNS, kafka_source, starting_offsets, with_kafka_connector
from queueplane.run.options import DeadLetters
from queueplane.run.outcomes import OUTCOME_SCHEMA
from queueplane.run.range_ends import RangeEndCommitter
from queueplane.run.runtime import QueueRuntime
from queueplane.run.settings import QueueSettings
from queueplane.spec.model import QueueSpec

# Records per micro-batch. Each batch costs Spark a fixed 0.5-1 s (offsets, planning, checkpoint
# writes, Python task start); memory does not grow with it: slot queues hold the reader back.
DEFAULT_BATCH_RECORDS = 50_000


def consumer_settings(queue: QueueSpec, target: KafkaTarget) -> ConsumerSettings:
    slots = 1 if queue.group.ordering == "partition" else queue.concurrency
    return ConsumerSettings(
        **QueueSettings.common(queue, target),
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


class ConsumerRuntime(QueueRuntime):
    group_type: ClassVar[str] = "consumer"
    _range_ends: RangeEndCommitter | None = None

    @staticmethod
    def executor_cap(queue: QueueSpec) -> int | None:
        """Executors beyond partitions x key slots over an executor's cores would get no work."""
        key_slots = queue.concurrency if queue.group.ordering == "key" else 1
        cores = max(1, int(queue.executor.get("cores", 1)))
        return max(1, math.ceil(queue.topic.partitions * key_slots / cores))

    def configure(self, builder: Any) -> Any:
        return with_kafka_connector(builder)

    def local_threads(self) -> int:
        """A task per partition at once (handlers mostly wait)."""
        return self.options.tasks or max(os.cpu_count() or 2, self.queue.topic.partitions)

    def after_batch(self, table: Any, ranges: dict[int, int]) -> None:
        """Tasks commit up to their last record; transaction markers beyond it are the driver's to pass."""
        if self._range_ends is None:
            self._range_ends = RangeEndCommitter(self.target, self.queue.group.id, self.queue.topic.name)
        self._range_ends.commit(ranges, table)

    def stop(self, counts: Counter[str], dead: DeadLetters) -> None:
        if self._range_ends is not None:
            self._range_ends.close()

    def stream(self, spark: Any, drain_file: Path, executor_ceiling: int | None) -> Any:
        queue, target = self.queue, self.target
        settings = consumer_settings(queue, target)
        if queue.exactly_once:
            fence_partitions(settings, queue.topic.name, queue.topic.partitions)
        reader = (
            kafka_source(spark, target, queue.topic.name, queue.group.id)
            .option("startingOffsets", starting_offsets(target, queue))
            .option("includeHeaders", "true")
            .option("maxOffsetsPerTrigger", str(self.options.max_batch_records or DEFAULT_BATCH_RECORDS))
        )
        return (
            reader.load()
            .selectExpr(*INPUT_COLUMNS)
            .mapInArrow(functools.partial(run_partition, settings.to_json()), OUTCOME_SCHEMA)
        )
