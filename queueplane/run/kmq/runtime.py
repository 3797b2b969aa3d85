"""kmq on the driver: the worker's streaming query and the redelivery tracker's, side by side.

The worker reads the queue topic with Spark's Kafka source; ``minPartitions`` above the
partition count makes the source split a partition's offset range over several tasks (kmq
keeps no order, so any task may take any slice). The tracker reads the markers topic
(``tracker.py``). Both run in one Spark application; the group's offsets are committed by the
driver once a batch is done.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from queueplane.kafka import clients
from queueplane.kafka.offsets import end_offsets
from queueplane.kafka.target import KafkaTarget
from queueplane.paths import home_dir
from queueplane.run.kafka_input import INPUT_COLUMNS, kafka_source, starting_offsets, with_kafka_connector
from queueplane.run.kmq import markers as km
from queueplane.run.kmq import resume
from queueplane.run.kmq.tasks import KmqSettings, run_range
from queueplane.run.kmq.tracker import (
    CHECKPOINT_DIR,
    GIVE_UP,
    STATE_STORE_PROVIDER,
    Expired,
    Redeliverer,
    TrackerClock,
    tracker_interval_ms,
    tracker_stream,
)
from queueplane.run.options import DeadLetters, RunOptions
from queueplane.run.outcomes import DEAD_LETTERED, OUTCOME_SCHEMA, REDELIVERED, key_text
from queueplane.run.range_ends import handled_ends, retry_commit
from queueplane.run.runtime import QueueRuntime
from queueplane.run.settings import QueueSettings
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.worker")


def kmq_settings(
    queue: QueueSpec, target: KafkaTarget, tasks: int, point: resume.ResumePoint | None = None
) -> KmqSettings:
    """``processing.concurrency`` is per executor; its ``tasks`` Python processes split it."""
    assert queue.markers is not None
    return KmqSettings(
        **QueueSettings.common(queue, target),
        **(point or resume.ResumePoint()).to_json_fields(),
        markers_topic=queue.markers.name,
        threads=max(1, -(-queue.concurrency // max(1, tasks))),
        backoff_ms=queue.retry_backoff_ms,
        max_backoff_ms=queue.retry_max_backoff_ms,
    )


def batch_records(queue: QueueSpec, requested: int | None) -> int:
    """Records per micro-batch: all of them get start markers at once, so maxInFlight per partition bounds it."""
    return requested or queue.group.max_in_flight * queue.topic.partitions


def checkpoint_root(queue: QueueSpec, requested: str | None) -> Path:
    """Where both queries keep their checkpoints. The tracker's state must survive a restart, so the
    default is a folder per group under queueplane's home, not a temporary one."""
    if requested:
        return Path(requested)
    return home_dir() / "checkpoints" / queue.group.id


class GroupCommitter:
    """Commits the group's offsets after a worker batch: past every record the batch handled.

    Each commit carries where the markers partition ended (``resume.py``), so a restart finds
    the records its replayed batch had already started.
    """

    def __init__(self, queue: QueueSpec, target: KafkaTarget):
        assert queue.markers is not None
        self.topic, self.markers_topic = queue.topic.name, queue.markers.name
        self.target, self.group = target, queue.group.id
        self.known: dict[int, int] = {}  # per partition, the offset last committed
        self.consumer, self.admin = self._clients()

    def _clients(self) -> tuple[Consumer, AdminClient]:
        role = {"group.id": self.group, "enable.auto.commit": False}
        return clients.consumer(self.target.settings, role), clients.admin(self.target)

    def _renew(self) -> None:
        """New clients: after a broker restart the old ones may keep failing (``retry_commit``)."""
        with contextlib.suppress(Exception):
            self.consumer.close()
        self.consumer, self.admin = self._clients()

    def commit(self, table: pa.Table, ranges: dict[int, int]) -> None:
        """Past every record the batch handled and over the markers at its ranges' ends (``range_ends.py``)."""
        handled = handled_ends(table)
        ends = {p: max(handled.get(p, -1), ranges.get(p, -1)) for p in handled.keys() | ranges.keys()}
        ends = {p: end for p, end in ends.items() if end > self.known.get(p, -1)}
        if not ends:
            return

        def commit() -> None:
            markers = end_offsets(self.admin, self.markers_topic, sorted(ends))
            offsets = [
                TopicPartition(self.topic, p, end, metadata=resume.commit_metadata(markers[p]))
                for p, end in sorted(ends.items())
            ]
            self.consumer.commit(offsets=offsets, asynchronous=False)

        if retry_commit(commit, self._renew, "kmq group offsets"):
            self.known.update(ends)

    def close(self) -> None:
        self.consumer.close()


class KmqRuntime(QueueRuntime):
    """The worker query beside the tracker query; the group's offsets committed after worker batches.

    The tracker's sink runs on its own driver thread, so it keeps its own counts; the run's
    summary takes them in when both queries have stopped.
    """

    group_type: ClassVar[str] = "kmq"
    shuffle_partitions: ClassVar[int] = 1  # the tracker is the only shuffle: one stateful partition, one Python worker

    def __init__(self, queue: QueueSpec, target: KafkaTarget, options: RunOptions):
        super().__init__(queue, target, options)
        self.counts: Counter[str] = Counter()
        self.dead = DeadLetters()
        self.committer = GroupCommitter(queue, target)
        self.redeliverer = Redeliverer(queue, target)
        self.tracker: Any = None
        self.tracker_batch_ms = 0  # how long the last tracker batch's sink ran
        self.clock = TrackerClock(
            self.redeliverer.producer, queue.markers.name, tracker_interval_ms(queue.group.lock_duration_ms)
        )
        self.root = checkpoint_root(queue, options.checkpoint_dir)

    def configure(self, builder: Any) -> Any:
        # The tracker runs a batch when markers come (TrackerClock ticks while it has open
        # deliveries), not on every trigger. The worker's other queries hold no state: Spark
        # runs no-data batches for stateful queries only.
        return (
            with_kafka_connector(builder)
            .config("spark.sql.streaming.stateStore.providerClass", STATE_STORE_PROVIDER)
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        )

    def local_threads(self) -> int:
        """A task per partition at least (handlers mostly wait), and the tracker's one task beside them."""
        return self.options.tasks or max(os.cpu_count() or 2, self.queue.topic.partitions) + 1

    def checkpoint(self) -> str:
        return str(self.root / "worker")

    def start(self, spark: Any) -> None:
        interval_ms = tracker_interval_ms(self.queue.group.lock_duration_ms)
        self.tracker = (
            tracker_stream(spark, self.queue, self.target)
            .writeStream.foreachBatch(self._tracker_batch)
            .option("checkpointLocation", str(self.root / CHECKPOINT_DIR))
            .trigger(processingTime=f"{interval_ms} milliseconds")
            .queryName(f"{self.queue.name}-tracker")
            .start()
        )
        threading.Thread(target=self.clock.run, args=(self.tracker,), name="qp-kmq-tick", daemon=True).start()

    def stream(self, spark: Any, drain_file: Path, executor_ceiling: int | None) -> Any:
        queue, target = self.queue, self.target
        tasks = self.options.tasks or spark.sparkContext.defaultParallelism
        reader = (
            kafka_source(spark, target, queue.topic.name, queue.group.id)
            .option("startingOffsets", starting_offsets(target, queue))
            .option("includeHeaders", "true")
            .option("maxOffsetsPerTrigger", str(batch_records(queue, self.options.max_batch_records)))
            .option("minPartitions", str(max(tasks, queue.topic.partitions)))
        )
        point = resume.resume_point(target, queue)
        if point.started:
            log.info(
                "kmq: %d records of the replayed batch already started; the tracker has them",
                sum(len(o) for o in point.started.values()),
            )
        settings_json = kmq_settings(queue, target, tasks, point).to_json()
        return (
            reader.load()
            .selectExpr(*INPUT_COLUMNS)
            .mapInArrow(functools.partial(run_range, settings_json), OUTCOME_SCHEMA)
        )

    def _tracker_batch(self, frame: Any, batch_id: int) -> None:
        began = time.monotonic()
        previous_ms, self.tracker_batch_ms = self.tracker_batch_ms, 0
        rows = frame.collect()
        if not rows:
            self.tracker_batch_ms = round((time.monotonic() - began) * 1000)
            return
        expired = []
        for row in rows:
            partition, offset = km.parse_id(row.id)
            expired.append(Expired(partition, offset, row.delivery_count, row.action))
        done = self.redeliverer.handle(expired)
        for record, item in done:
            if item.action == GIVE_UP:
                self.counts[DEAD_LETTERED] += 1
                self.dead.add(
                    {
                        "partition": record.partition,
                        "offset": record.offset,
                        "key": key_text(record),
                        "delivery_count": item.delivery_count,
                        "error": "Timeout: delivery not ended within lockDuration",
                    }
                )
            else:
                self.counts[REDELIVERED] += 1
        self.tracker_batch_ms = round((time.monotonic() - began) * 1000)
        # A redelivery is due at the first trigger after its deadline, which waits for the batch
        # before it to end: both durations say how late past lockDuration + interval it can be.
        log.info(
            "tracker batch %d: %d redelivered, %d dead-lettered (totals %d/%d); took %d ms, the batch before %d ms",
            batch_id,
            sum(1 for _, i in done if i.action != GIVE_UP),
            sum(1 for _, i in done if i.action == GIVE_UP),
            self.counts[REDELIVERED],
            self.counts[DEAD_LETTERED],
            self.tracker_batch_ms,
            previous_ms,
        )

    def after_batch(self, table: pa.Table, ranges: dict[int, int]) -> None:
        self.committer.commit(table, ranges)
        self.clock.last_worker_batch = time.time()

    def idle(self) -> bool:
        """No delivery open in the tracker: nothing can still come back."""
        return self.tracker is not None and not self.clock.wanted(self.tracker)

    def failed(self) -> BaseException | None:
        if self.tracker is None or self.tracker.isActive:
            return None
        return self.tracker.exception()

    def stop(self, counts: Counter[str], dead: DeadLetters) -> None:
        self.clock.stop()
        if self.tracker is not None and self.tracker.isActive:
            self.tracker.stop()
        self.redeliverer.close()
        self.committer.close()
        counts.update(self.counts)
        dead.merge(self.dead)
