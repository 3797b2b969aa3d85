"""The kmq redelivery tracker: a stateful streaming query over the markers topic.

State is kept per partition of the queue topic: a map from a record's offset to its open
delivery (count, start, deadline), and one processing-time timer at the earliest deadline in
the map. A batch folds its markers in Python (``fold_markers``): a delivery that starts and
ends within one batch, the usual case, never touches the state store. Only the deliveries a
batch leaves open, or closes after an earlier batch left them open, are written. Keyed by
message instead, every message cost at least two round trips between Spark's JVM and the
Python worker (its key, its state) and two more for its timer when it stayed open; how much
that weighs end to end is in docs/benchmarks.md (kmq worker).

An ``end`` marker closes a delivery; a deadline that passes first emits it, and the driver's
sink (``Redeliverer``) produces the message again with its delivery count raised (or to the
DLQ once deliveryLimit deliveries were made), then writes the ``end`` marker of the timed-out
delivery. State and the markers' offsets live in the query's checkpoint (RocksDB), so a
restarted worker keeps the deliveries it was watching.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.limits import PRODUCER_MAX_BYTES, largest_record
from queueplane.kafka.target import KafkaTarget
from queueplane.run.dead_letters import Failure
from queueplane.run.handler import Record
from queueplane.run.kafka_input import kafka_source
from queueplane.run.kmq import markers as km
from queueplane.run.outcomes import ProducedRecord, dead_letter_record, produce_and_wait
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.worker")

STATE_STORE_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
REDELIVER, GIVE_UP = "redeliver", "dlq"
EXPIRED_SCHEMA = "id string, delivery_count int, started_ms long, due_ms long, action string"
OPEN_KEY_SCHEMA = "offset long"
OPEN_SCHEMA = "delivery_count int, started_ms long, due_ms long"
# The query's checkpoint folder. Its state is keyed by the queue's partition; a checkpoint of
# the tracker keyed by message ("tracker") cannot be read by it, so a worker upgraded from one
# starts this afresh and rebuilds the open deliveries from the retained markers.
CHECKPOINT_DIR = "tracker-by-partition"

Open = tuple[int, int, int]  # an open delivery: its count, when it started, when it is due (epoch ms)
FETCH_TIMEOUT_S = 30.0


def tracker_interval_ms(lock_ms: int) -> int:
    """How often the tracker looks for deadlines passed: a fifth of lockDuration, within 1s..10s."""
    return max(1000, min(10_000, lock_ms // 5))


def fold_markers(rows: Iterable[Any], before: Mapping[int, Open], lock_ms: int) -> dict[int, Open | None]:
    """What one batch's markers of a partition, in marker order, make of each delivery they name:
    open (as of its last marker) or ended (None). ``before`` is what earlier batches left open: a
    retry marker keeps the start of the delivery it follows."""
    after: dict[int, Open | None] = {}
    for row in rows:
        offset = row.queue_offset
        if row.kind == km.END:
            after[offset] = None
        elif row.kind == km.START:
            after[offset] = (row.delivery_count, row.at_ms, row.at_ms + lock_ms)
        elif row.kind == km.RETRY:
            state = after[offset] if offset in after else before.get(offset)
            after[offset] = (row.delivery_count, state[1] if state else row.at_ms, row.at_ms + row.delay_ms)
    return after


def tracker_processor(lock_ms: int, delivery_limit: int) -> Any:
    """The StatefulProcessor (Row API), built here so pyspark loads only where the tracker runs."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class DeliveryTracker(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.open = handle.getMapState("open", OPEN_KEY_SCHEMA, OPEN_SCHEMA)

        def _before(self) -> dict[int, Open]:
            """The partition's open deliveries: few (those in flight at a batch's end), read at once."""
            return {key[0]: tuple(value) for key, value in self.open.iterator()}

        def _timer_at(self, due_ms: int | None) -> None:
            """One timer per partition, at its earliest deadline; none while nothing is open."""
            timers = list(self.handle.listTimers())
            for timer in timers:
                if timer != due_ms:
                    self.handle.deleteTimer(timer)
            if due_ms is not None and due_ms not in timers:
                self.handle.registerTimer(due_ms)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            # In marker order: a restart may start a delivery again after its earlier end.
            ordered = sorted(rows, key=lambda r: (r.marker_partition, r.marker_offset))
            before = self._before()
            after = fold_markers(ordered, before, lock_ms)
            for offset, state in after.items():
                old = before.get(offset)
                if state is None:
                    if old is not None:
                        self.open.removeKey((offset,))
                elif state != old:
                    self.open.updateValue((offset,), state)
            still_open = {**before, **after}
            self._timer_at(min((s[2] for s in still_open.values() if s is not None), default=None))
            return iter([])

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            # pyspark deletes the timer that fired once this returns; the next one is later than it.
            now_ms = timerValues.getCurrentProcessingTimeInMs()
            partition = key[0]
            later: list[int] = []
            for offset, (count, started_ms, due_ms) in self._before().items():
                if due_ms > now_ms:
                    later.append(due_ms)
                    continue
                self.open.removeKey((offset,))
                action = GIVE_UP if count >= delivery_limit else REDELIVER
                yield Row(
                    id=km.message_id(partition, offset),
                    delivery_count=count,
                    started_ms=started_ms,
                    due_ms=due_ms,
                    action=action,
                )
            if later:
                self.handle.registerTimer(min(later))

        def close(self) -> None:
            pass

    return DeliveryTracker()


def tracker_stream(spark: Any, queue: QueueSpec, target: KafkaTarget) -> Any:
    """The deliveries whose deadline passed, as a streaming DataFrame (EXPIRED_SCHEMA)."""
    assert queue.markers is not None
    markers = (
        kafka_source(spark, target, queue.markers.name, queue.group.id)
        # Only without a checkpoint: every retained marker, so the open deliveries are rebuilt.
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(*km.SQL_COLUMNS)
        .selectExpr(*km.SQL_FIELDS)
        # A tick has done its work once it is read: the batch runs, and the timers due fire.
        .where(f"id != '{km.TICK}'")
        .selectExpr(
            "*",
            "CAST(substring_index(id, ':', 1) AS INT) AS queue_partition",
            "CAST(substring_index(id, ':', -1) AS BIGINT) AS queue_offset",
        )
    )
    return markers.groupBy("queue_partition").transformWithState(
        tracker_processor(queue.group.lock_duration_ms, queue.group.delivery_limit),
        EXPIRED_SCHEMA,
        "Append",
        "ProcessingTime",
    )


class TrackerClock:
    """Wakes the tracker while it watches deliveries, and lets it sleep while it watches none.

    Spark runs a ``transformWithState`` query with processing-time timers on every trigger,
    data or not, so that its timers can fire: an idle kmq queue planned a batch (driver and
    Python work) every tracker interval. The worker turns those no-data batches off
    (``spark.sql.streaming.noDataMicroBatches.enabled``), so the tracker runs a batch only
    when markers come, and this writes a tick marker every half interval while the tracker may
    hold an open delivery: its count as of its last batch is above 0, that batch began before
    the last worker batch ended (markers it has not read), or no batch has run yet.
    """

    def __init__(self, producer: Any, markers_topic: str, interval_ms: int):
        self.producer = producer
        self.markers_topic = markers_topic
        self.every_s = interval_ms / 2000
        self.last_worker_batch = time.time()  # epoch seconds; set by the runtime after each worker batch
        self._known: tuple[float, int] | None = None  # (when, open deliveries) of the last batch run
        self._stop = threading.Event()

    def open_deliveries(self, query: Any, since: float) -> int | None:
        """Open deliveries as of the tracker's last batch, if that batch began after ``since``; else None."""
        self._read(query)
        if self._known is None or self._known[0] <= since:
            return None
        return self._known[1]

    def _read(self, query: Any) -> None:
        """The last batch's state rows. Progress reports of triggers that ran no batch have no state
        operators: the last batch's count stands."""
        progress = query.lastProgress
        if progress and progress.get("stateOperators"):
            began = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
            self._known = (began, int(progress["stateOperators"][0].get("numRowsTotal", 0)))

    def wanted(self, query: Any) -> bool:
        """Not known to hold no open delivery: as of a batch that saw the last worker batch's markers."""
        return self.open_deliveries(query, self.last_worker_batch) != 0

    def run(self, query: Any) -> None:
        """Until ``stop``: a tick whenever one is wanted, every half interval."""
        while not self._stop.wait(self.every_s):
            try:
                if query.isActive and self.wanted(query):
                    key, value = km.tick(int(time.time() * 1000))
                    self.producer.produce(self.markers_topic, value, key, partition=0)
            except Exception:  # a lost tick is a batch a half interval later; the next one goes
                log.warning("kmq: the tracker's tick failed; trying again", exc_info=True)

    def stop(self) -> None:
        self._stop.set()


class TrackerFetchFailed(RuntimeError):
    """Expired records could not be read; ending them now would lose them."""


@dataclass
class Expired:
    partition: int
    offset: int
    delivery_count: int
    action: str


class Redeliverer:
    """The tracker's sink on the driver: fetch each expired message, produce it again or to the DLQ, end it."""

    def __init__(self, queue: QueueSpec, target: KafkaTarget):
        assert queue.markers is not None
        self.queue = queue
        self.settings = dict(target.settings)
        # It copies records back onto the queue topic, or to the DLQ: as large as those topics take.
        largest = largest_record(target, [queue.topic.name, queue.dead_letter.name]) or 0
        role = {"enable.idempotence": True, "acks": "all", "message.max.bytes": max(PRODUCER_MAX_BYTES, largest)}
        self.producer = clients.producer(self.settings, role)
        self._stop = threading.Event()
        threading.Thread(target=self._serve_deliveries, name="qp-kmq-redeliver", daemon=True).start()

    def _serve_deliveries(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

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
                headers = km.redelivery_headers(record.headers, where, item.delivery_count + 1, first_ms)
                writes.append((self.queue.topic.name, record.key, record.value, headers))
            done.append((record, item))
        produce_and_wait(self.producer, writes)
        ends = [km.Marker(i.partition, i.offset, km.END, i.delivery_count, now_ms) for i in expired]
        km.write_markers(self.producer, self.queue.markers.name, ends)
        return done

    def _fetch(self, expired: list[Expired]) -> dict[tuple[int, int], Record]:
        """The expired messages from the queue topic, read by offset (no group, nothing committed)."""
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
        which fails the tracker's batch before it writes any end marker, so the restarted batch
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
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending = []  # the end of the partition: the rest are gone
                        break
                    log.warning("kmq tracker: reading %s[%d] failed: %s; retrying", topic, partition, msg.error())
                    time.sleep(0.5)
                    continue
                position = msg.offset() + 1
                while pending and pending[0] < msg.offset():
                    pending.pop(0)  # compacted away or a transaction marker
                if pending and pending[0] == msg.offset():
                    pending.pop(0)
                    found[(partition, msg.offset())] = Record(
                        key=msg.key(),
                        value=msg.value(),
                        headers=tuple(msg.headers() or ()),
                        topic=topic,
                        partition=partition,
                        offset=msg.offset(),
                        delivery_count=0,
                        timestamp=msg.timestamp()[1],
                    )
                if pending and pending[0] - position > 1000:
                    break  # far ahead: seek rather than read the gap
        if pending:
            raise TrackerFetchFailed(
                f"kmq tracker: {len(pending)} expired records of {topic}[{partition}] not read within "
                f"{FETCH_TIMEOUT_S:.0f}s; the tracker batch fails and runs again, nothing is ended"
            )
        return found

    def close(self) -> None:
        self.producer.flush(10)
        self._stop.set()
