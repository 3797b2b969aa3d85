"""kmq on the driver: the worker's streaming query of its group's members, and the redelivery
tracker's thread beside it.

Each Python worker process of the queue is a member of its consumer group (member.py, built on
the consumer runtime's members and their time-slice source): it polls, runs its tasks, and
commits the group's offsets past each task. The tracker reads the markers topic with its own
consumer on a driver thread (``tracker.py``); after each micro-batch with rows it reads where
the markers partitions end, so the queue counts as idle only once it has read every marker of
the tasks reported so far. Neither reads through Spark's Kafka source, so the session needs no
Kafka connector.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, ClassVar

import pyarrow as pa
from confluent_kafka.admin import AdminClient

from queueplane.handler_api import Record
from queueplane.kafka import clients
from queueplane.kafka.offsets import end_offsets
from queueplane.kafka.target import KafkaTarget
from queueplane.run.consumer.executor.process import MemberSettings
from queueplane.run.consumer.runtime import ConsumerRuntime
from queueplane.run.driver.options import DeadLetters, RunOptions
from queueplane.run.kmq.executor.tasks import KmqSettings
from queueplane.run.kmq.redeliverer import GIVE_UP, Expired, Redeliverer
from queueplane.run.kmq.tracker import OpenDeliveries, Tracker
from queueplane.run.outcomes import DEAD_LETTERED, REDELIVERED, key_text
from queueplane.run.settings import QueueSettings
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.worker")


def kmq_settings(queue: QueueSpec, target: KafkaTarget, tasks: int, protocol: str = "classic") -> KmqSettings:
    """``processing.concurrency`` is per executor; its ``tasks`` Python processes split it."""
    assert queue.markers is not None
    return KmqSettings(
        **QueueSettings.common(queue, target),
        markers_topic=queue.markers.name,
        threads=max(1, -(-queue.concurrency // max(1, tasks))),
        backoff_ms=queue.retry_backoff_ms,
        max_backoff_ms=queue.retry_max_backoff_ms,
        max_in_flight=queue.group.max_in_flight,
        topic=queue.topic.name,
        start_from="earliest" if queue.group.start_from == "earliest" else "latest",
        group_protocol=protocol,
    )


class GroupCommitter:
    """Where the markers partitions end: what the tracker reads before the queue counts as idle.

    The group's offsets themselves are committed by its members (member.py).
    """

    def __init__(self, queue: QueueSpec, target: KafkaTarget):
        assert queue.markers is not None
        self.markers_topic = queue.markers.name
        self.admin: AdminClient = clients.admin(target)

    def markers_ends(self) -> dict[int, int]:
        """Where every markers partition ends now; raises while the broker does not answer (the
        tracker asks on its own thread, again after a pause, so an outage never ends the worker)."""
        partitions = self.admin.list_topics(self.markers_topic, timeout=10).topics[self.markers_topic].partitions
        return end_offsets(self.admin, self.markers_topic, sorted(partitions))

    def close(self) -> None:
        return None


class KmqRuntime(ConsumerRuntime):
    """The members' query (the consumer runtime's, with kmq's members) and the tracker thread beside it.

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
        self._requeued_at: float | None = None
        self.tracker = Tracker(
            target, queue.group.id, queue.markers.name, deliveries, self._redeliver, self._redelivered
        )

    def start(self, spark: Any) -> None:
        # Deliveries a run before this one left open are in the markers written so far: the
        # tracker reads them all before the queue can count as idle.
        self.tracker.expect_from(self.committer.markers_ends)
        self.tracker.start()

    def member_settings(self, protocol: str, tasks: int) -> MemberSettings:
        return kmq_settings(self.queue, self.target, tasks, protocol)

    def member_source(self) -> type[Any]:
        from queueplane.run.kmq.source import KmqMemberSource

        return KmqMemberSource

    def _redeliver(self, expired: list[Expired]) -> list[tuple[Record, Expired]]:
        """On the tracker's thread: the redeliverer's round, noted as records back on the topic
        before the tracker closes their deliveries (from then on ``idle`` may say True)."""
        done = self.redeliverer.handle(expired)
        if any(item.action != GIVE_UP for _, item in done):
            self._requeued_at = time.monotonic()
        return done

    def requeued_at(self) -> float | None:
        return self._requeued_at

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
        """The batch's rows came from tasks whose markers are durable: the tracker reads up to them."""
        if table.num_rows:
            self.tracker.expect_from(self.committer.markers_ends)

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
