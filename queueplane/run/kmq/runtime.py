"""kmq on the driver: the worker's streaming query, and the redelivery tracker's thread beside it.

The worker reads the queue topic with Spark's Kafka source; ``minPartitions`` above the
partition count makes the source split a partition's offset range over several tasks (kmq
keeps no order, so any task may take any slice). The tracker reads the markers topic with its
own consumer on a driver thread (``tracker.py``). The group's offsets are committed by the
driver once a batch is done.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from queueplane.kafka import clients
from queueplane.kafka.offsets import end_offsets
from queueplane.kafka.target import KafkaTarget
from queueplane.run.handler import Record
from queueplane.run.kafka_input import INPUT_COLUMNS, kafka_source, starting_offsets, with_kafka_connector
from queueplane.run.kmq import resume
from queueplane.run.kmq.redeliverer import GIVE_UP, Expired, Redeliverer
from queueplane.run.kmq.tasks import KmqSettings, run_range
from queueplane.run.kmq.tracker import OpenDeliveries, Tracker
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

    def commit(self, table: pa.Table, ranges: dict[int, int]) -> dict[int, int]:
        """Past every record the batch handled and over the markers at its ranges' ends (``range_ends.py``).

        Returns where the markers partitions it committed ended: the batch's markers are there.
        """
        handled = handled_ends(table)
        ends = {p: max(handled.get(p, -1), ranges.get(p, -1)) for p in handled.keys() | ranges.keys()}
        ends = {p: end for p, end in ends.items() if end > self.known.get(p, -1)}
        if not ends:
            return {}
        markers: dict[int, int] = {}

        def commit() -> None:
            markers.update(end_offsets(self.admin, self.markers_topic, sorted(ends)))
            offsets = [
                TopicPartition(self.topic, p, end, metadata=resume.commit_metadata(markers[p]))
                for p, end in sorted(ends.items())
            ]
            self.consumer.commit(offsets=offsets, asynchronous=False)

        if retry_commit(commit, self._renew, "kmq group offsets"):
            self.known.update(ends)
        return markers

    def markers_ends(self) -> dict[int, int]:
        """Where every markers partition ends now; raises while the broker does not answer (the
        tracker asks on its own thread, again after a pause, so an outage never ends the worker)."""
        partitions = self.admin.list_topics(self.markers_topic, timeout=10).topics[self.markers_topic].partitions
        return end_offsets(self.admin, self.markers_topic, sorted(partitions))

    def close(self) -> None:
        self.consumer.close()


class KmqRuntime(QueueRuntime):
    """The worker query, the tracker thread beside it, and the group's offsets committed after worker batches.

    The tracker's redeliveries run on its own thread, so it keeps its own counts; the run's
    summary takes them in once it has stopped.
    """

    group_type: ClassVar[str] = "kmq"

    def __init__(self, queue: QueueSpec, target: KafkaTarget, options: RunOptions):
        super().__init__(queue, target, options)
        assert queue.markers is not None
        self.counts: Counter[str] = Counter()
        self.dead = DeadLetters()
        self.committer = GroupCommitter(queue, target)
        self.redeliverer = Redeliverer(queue, target)
        deliveries = OpenDeliveries(queue.group.lock_duration_ms, queue.group.delivery_limit)
        self.tracker = Tracker(
            target, queue.group.id, queue.markers.name, deliveries, self.redeliverer.handle, self._redelivered
        )

    def configure(self, builder: Any) -> Any:
        return with_kafka_connector(builder)

    def local_threads(self) -> int:
        """A task per partition at least: handlers mostly wait."""
        return self.options.tasks or max(os.cpu_count() or 2, self.queue.topic.partitions)

    def start(self, spark: Any) -> None:
        # Deliveries a run before this one left open are in the markers written so far: the
        # tracker reads them all before the queue can count as idle.
        self.tracker.expect_from(self.committer.markers_ends)
        self.tracker.start()

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

    def _redelivered(self, done: list[tuple[Record, Expired]]) -> None:
        """On the tracker's thread: count a round's redeliveries and keep its dead letters."""
        given_up = 0
        for record, item in done:
            if item.action == GIVE_UP:
                given_up += 1
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
        log.info(
            "kmq tracker: %d redelivered, %d dead-lettered (totals %d/%d)",
            len(done) - given_up,
            given_up,
            self.counts[REDELIVERED],
            self.counts[DEAD_LETTERED],
        )

    def after_batch(self, table: pa.Table, ranges: dict[int, int]) -> None:
        self.tracker.expect(self.committer.commit(table, ranges))

    def idle(self) -> bool:
        """No delivery open in the tracker, which has read every marker of the batches so far."""
        return self.tracker.idle()

    def failed(self) -> BaseException | None:
        return self.tracker.failure

    def degraded(self) -> str | None:
        return self.tracker.degraded()

    def stop(self, counts: Counter[str], dead: DeadLetters) -> None:
        self.tracker.stop()
        self.redeliverer.close()
        self.committer.close()
        counts.update(self.counts)
        dead.merge(self.dead)
