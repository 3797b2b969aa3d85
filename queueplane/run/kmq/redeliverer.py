"""The kmq tracker's hands: a delivery whose deadline passed is read from the queue topic and produced again.

A message is produced again onto the queue topic with its delivery count raised (kept, for a
delivery its task released without a call) and its origin in the headers
(``markers.redelivery_headers``), or, once ``deliveryLimit`` deliveries were made, to the DLQ
as a ``Timeout``; then the timed-out delivery's ``expired`` marker is written. Only records it
has read are ended: an expired record that cannot be read fails the round before any marker
(``TrackerFetchFailed``), so nothing ends unread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from queueplane.handler_api import Record
from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.consumed import headers_of, offset_of
from queueplane.kafka.limits import PRODUCER_MAX_BYTES, largest_record
from queueplane.kafka.target import KafkaTarget
from queueplane.run.dead_letters import Failure
from queueplane.run.kmq import markers as km
from queueplane.run.outcomes import ProducedRecord, dead_letter_record, produce_and_wait
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.worker")

REDELIVER, GIVE_UP = "redeliver", "dlq"
FETCH_TIMEOUT_S = 30.0


class TrackerFetchFailed(RuntimeError):
    """Expired records could not be read; ending them now would lose them."""


@dataclass
class Expired:
    partition: int
    offset: int
    delivery_count: int
    action: str
    counted: bool = True  # False: released, no call tried; the copy keeps this count


class Redeliverer:
    """The tracker's sink on the driver: fetch each expired message, produce it again or to the DLQ, end it."""

    def __init__(self, queue: QueueSpec, target: KafkaTarget):
        assert queue.markers is not None
        self.queue = queue
        self.markers_topic = queue.markers.name
        self.settings = dict(target.settings)
        # It copies records back onto the queue topic, or to the DLQ: as large as those topics take.
        largest = largest_record(target, [queue.topic.name, queue.dead_letter.name]) or 0
        role = {"enable.idempotence": True, "acks": "all", "message.max.bytes": max(PRODUCER_MAX_BYTES, largest)}
        self.producer = clients.producer(self.settings, role)
        self._stop = threading.Event()
        threading.Thread(target=self._serve_deliveries, name="qp-kmq-redeliver", daemon=True).start()

    def _serve_deliveries(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(clients.SERVE_POLL_S)

    def handle(self, expired: list[Expired]) -> list[tuple[Record, Expired]]:
        """Redeliver or dead-letter each; returns the records with what was done to them."""
        if not expired:
            return []
        records = self._fetch(expired)
        now_ms = int(time.time() * 1000)
        writes: list[ProducedRecord] = []
        done: list[tuple[Record, Expired]] = []
        lock_s = self.queue.group.lock_duration_ms / 1000
        for item in expired:
            record = records.get((item.partition, item.offset))
            if record is None:
                log.warning("kmq: %s:%s is no longer on %s; not redelivered", item.partition, item.offset, self.queue)
                continue
            where = km.origin(record.headers, record.topic, record.partition, record.offset)
            first_ms = where.first_attempt_ms or now_ms
            if item.action == GIVE_UP:
                failure = Failure(
                    "Timeout",
                    f"delivery {item.delivery_count} not ended within {lock_s:g}s"
                    " (its handler call hung, or its process died)",
                )
                at_origin = Record(
                    record.key,
                    record.value,
                    record.headers,
                    where.topic,
                    where.partition,
                    where.offset,
                    item.delivery_count,
                    record.timestamp,
                )
                writes.append(
                    dead_letter_record(
                        at_origin, self.queue.dead_letter.name, item.delivery_count, failure, first_ms, now_ms
                    )
                )
            else:
                count = item.delivery_count + 1 if item.counted else item.delivery_count
                headers = km.redelivery_headers(record.headers, where, count, first_ms)
                writes.append((self.queue.topic.name, record.key, record.value, headers))
            done.append((record, item))
        produce_and_wait(self.producer, writes)
        ends = [km.Marker(i.partition, i.offset, km.EXPIRED, i.delivery_count, now_ms) for i in expired]
        km.write_markers(self.producer, self.markers_topic, ends)
        return done

    def _fetch(self, expired: list[Expired]) -> dict[tuple[int, int], Record]:
        """The expired messages from the queue topic, read by offset: assigned, nothing committed (the
        client needs a group id; the tracker's, whose commits are on the markers topic, is left alone)."""
        wanted: dict[int, set[int]] = {}
        for item in expired:
            wanted.setdefault(item.partition, set()).add(item.offset)
        consumer = clients.consumer(
            self.settings,
            {
                "group.id": kn.kmq_tracker_group(self.queue.group.id),
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # An offset below the log's start was removed by retention: read on from the start.
                "auto.offset.reset": "earliest",
            },
        )
        found: dict[tuple[int, int], Record] = {}
        try:
            for partition, offsets in wanted.items():
                found.update(self._read_partition(consumer, partition, sorted(offsets)))
        finally:
            consumer.close()
        return found

    def _read_partition(self, consumer: Consumer, partition: int, offsets: list[int]) -> dict[tuple[int, int], Record]:
        """The records at ``offsets``; those not returned are gone from the topic (retention,
        compaction). Only the end of the partition or the log's start says a record is gone: a
        fetch error or a slow broker raises TrackerFetchFailed once FETCH_TIMEOUT_S has passed,
        which fails the round before it writes any end marker, so the next round
        finds the same deliveries expired again."""
        topic = self.queue.topic.name
        found: dict[tuple[int, int], Record] = {}
        pending = list(offsets)
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            consumer.assign([TopicPartition(topic, partition, pending[0])])
            position = pending[0]
            while pending and time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending = []  # the end of the partition: the rest are gone
                        break
                    log.warning("kmq tracker: reading %s[%d] failed: %s; retrying", topic, partition, error)
                    time.sleep(0.5)
                    continue
                offset = offset_of(msg)
                position = offset + 1
                while pending and pending[0] < offset:
                    pending.pop(0)  # compacted away or a transaction marker
                if pending and pending[0] == offset:
                    pending.pop(0)
                    found[(partition, offset)] = Record(
                        key=msg.key(),
                        value=msg.value(),
                        headers=tuple(headers_of(msg)),
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        delivery_count=0,
                        timestamp=msg.timestamp()[1],
                    )
                if pending and pending[0] - position > 1000:
                    break  # far ahead: seek rather than read the gap
        if pending:
            raise TrackerFetchFailed(
                f"kmq tracker: {len(pending)} expired records of {topic}[{partition}] not read within "
                f"{FETCH_TIMEOUT_S:.0f}s; nothing is ended, and the tracker tries again"
            )
        return found

    def close(self) -> None:
        self.producer.flush(10)
        self._stop.set()
