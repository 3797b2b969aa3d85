"""The consumer-group runtime that runs inside Spark's Python workers, one task per Kafka partition.

Spark's Kafka source hands a task the records of one partition in offset order. The task
spreads them over slot threads (one for ordering=partition; for ordering=key,
``processing.concurrency`` slots chosen by FNV-1a of the key) through bounded queues, so a
slow slot holds the reader back instead of filling memory. A slot handles its records one
by one, retrying a failing record in place with backoff until the delivery limit, so no
later record of the same key overtakes it.

Progress is committed to the spec's group id only up to the lowest offset not yet done
(ContiguousOffsets): plain commits of durable work (at-least-once), or Kafka transactions
holding the outputs and DLQ records of exactly that prefix with its offsets (exactlyOnce,
KIP-447 offsets-in-transaction, one transactional id per input partition so a zombie task is
fenced). A record below the group's committed offset was already handled: skipped, so a
restart from an older Spark checkpoint does not write it again.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from queueplane.dlq import Failure
from queueplane.handler import Handler, Record, Reject, load_handler, outputs_of
from queueplane.lag import fetch_committed
from queueplane.worker.ordering import ContiguousOffsets, key_slot, retry_delay_ms
from queueplane.worker.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    RELEASED,
    SKIPPED,
    Outcome,
    ProducedRecord,
    dead_letter_record,
    outcome_batch,
    output_record,
    produce,
)
from queueplane.worker.processes import PerProcess, ServedProducer
from queueplane.worker.settings import JsonSettings

log = logging.getLogger("queueplane.worker")

# Columns the driver selects from Spark's Kafka source before handing batches to the tasks.
INPUT_COLUMNS = ("key", "value", "topic", "partition", "offset", "unix_millis(timestamp) AS ts", "headers")
WATCH_INTERVAL_S = 0.05
MAX_CACHED_KEYS = 100_000
TXN_TIMEOUT_S = 60.0
COMMIT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ConsumerSettings(JsonSettings):
    """Everything a task needs, sent from the driver as JSON (no spec parsing on executors)."""

    kafka: dict[str, str]
    queue: str
    group_id: str
    dlq_topic: str
    output_topic: str | None
    lock_ms: int
    delivery_limit: int
    handler: str
    ordering: str
    slots: int
    slot_queue: int
    backoff_ms: int
    max_backoff_ms: int
    exactly_once: bool
    commit_interval_ms: int = 1000
    search_paths: list[str] = field(default_factory=list)

    def transactional_id(self, topic: str, partition: int) -> str:
        """Stable per input partition: a new task's producer fences the one a dead task left behind."""
        return f"queueplane.{self.group_id}.{topic}.{partition}"


class WorkerProcess:
    """One per Python worker process and queue: the handler, the plain producer, the group's committer."""

    def __init__(self, settings: ConsumerSettings):
        from queueplane.cluster import quiet_logger

        self.settings = settings
        self.handler: Handler = load_handler(settings.handler, settings.search_paths)
        self.delivery = ServedProducer(settings.kafka, linger_ms=2)
        self.producer = self.delivery.producer
        # Never subscribes: it reads and commits the group's offsets, and lends its group metadata
        # to transactions. read_committed makes committed() wait for offsets of open transactions.
        self.group = Consumer(
            {
                **settings.kafka,
                "group.id": settings.group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "logger": quiet_logger(),
            }
        )

    def committed(self, topic: str, partition: int) -> int | None:
        return fetch_committed(self.group, topic, [partition])[partition]

    def commit(self, topic: str, partition: int, offset: int) -> None:
        self.group.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)

    def close(self) -> None:
        self.delivery.close()
        with contextlib.suppress(Exception):
            self.group.close()


def transactional_producer(settings: ConsumerSettings, topic: str, partition: int) -> Producer:
    """The partition's transactional producer, initialised.

    init_transactions fences any earlier producer with this id and aborts its open
    transaction, so what a dead task left half-written is never read by read_committed
    consumers, and the group's committed offset for the partition is settled.
    """
    from queueplane.cluster import quiet_logger

    producer = Producer(
        {
            **settings.kafka,
            "transactional.id": settings.transactional_id(topic, partition),
            "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000),
            "linger.ms": 5,
            "logger": quiet_logger(),
        }
    )
    producer.init_transactions(TXN_TIMEOUT_S)
    return producer


class TransactionalWriter:
    """A transactional producer for one input partition: outputs and offsets land together or not at all."""

    def __init__(self, process: WorkerProcess, topic: str, partition: int):
        self.process = process
        self.producer = transactional_producer(process.settings, topic, partition)

    def commit(self, records: list[ProducedRecord], offset: TopicPartition) -> None:
        for attempt in range(1, 4):
            try:
                self.producer.begin_transaction()
                for item in records:
                    produce(self.producer, item, serve=True)
                self.producer.send_offsets_to_transaction(
                    [offset], self.process.group.consumer_group_metadata(), TXN_TIMEOUT_S
                )
                self.producer.commit_transaction(TXN_TIMEOUT_S)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.txn_requires_abort() and attempt < 3:
                    log.warning("transaction for %s aborted, trying again: %s", offset, error)
                    self.producer.abort_transaction(TXN_TIMEOUT_S)
                    continue
                raise

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.producer.flush(5)


@dataclass
class _Call:
    record: Record
    attempt: int
    first_ms: int
    started: float


class Slot:
    """One thread handling its records in order; the watchdog replaces it when a call passes its deadline.

    Records arrive in chunks (one queue hand-off per chunk, not per record: waking a thread
    per record cost more than a trivial handler). ``backlog`` holds the taken chunk's records
    not yet started, so a thread that replaces a stuck one carries on where it stopped.

    A Python thread cannot be stopped: a call past ``lockDuration`` keeps its thread, which
    exits when the call returns and drops the result (``generation`` moved on), while a new
    thread carries on with the record's next attempt and the rest of the backlog.
    """

    DEPTH = 4  # chunks a slot's queue holds: the reader fills the next ones while the slot works

    def __init__(self, task: PartitionTask, index: int):
        self.task = task
        self.index = index
        self.queue: queue.Queue[list[Record] | None] = queue.Queue(maxsize=self.DEPTH)
        self.backlog: deque[Record] = deque()
        self.lock = threading.Lock()
        self.generation = 0
        self.current: _Call | None = None
        self.finished = threading.Event()
        self._start(None)

    def _start(self, resume: tuple[Record, int, int, float] | None) -> None:
        gen = self.generation
        threading.Thread(target=self._loop, args=(gen, resume), name=f"qp-slot-{self.index}", daemon=True).start()

    def _loop(self, gen: int, resume: tuple[Record, int, int, float] | None) -> None:
        try:
            if resume is not None and not self._handle(gen, *resume):
                return
            backlog = self.backlog
            while True:
                if not backlog:
                    chunk = self.queue.get()
                    if chunk is None:
                        self.finished.set()
                        return
                    backlog.extend(chunk)
                if not self._handle(gen, backlog.popleft(), 1, int(time.time() * 1000), 0.0):
                    return
        except BaseException as exc:  # a bug here must fail the task, not hang it
            self.task.fail(exc)
            self.finished.set()

    def _handle(self, gen: int, record: Record, attempt: int, first_ms: int, wait_ms: float) -> bool:
        """Attempts of one record until it ends; False when the watchdog took this thread's place."""
        s = self.task.settings
        while True:
            if wait_ms:
                time.sleep(wait_ms / 1000)
            delivery = record if record.delivery_count == attempt else replace(record, delivery_count=attempt)
            started = time.monotonic()
            with self.lock:
                if gen != self.generation:
                    return False
                self.current = _Call(delivery, attempt, first_ms, started)
            inflight = self.task.inflight(+1)
            final = False
            failure: Failure | None = None
            outputs: list[ProducedRecord] = []
            try:
                result = self.task.process.handler(delivery)
                outputs = [output_record(o, delivery, s.output_topic) for o in outputs_of(result)]
            except Reject as exc:
                failure, final = Failure.of(exc), True
            except Exception as exc:  # Retry and any other exception: another attempt, unless this was the last
                failure = Failure.of(exc)
            finally:
                self.task.inflight(-1)
            with self.lock:
                if gen != self.generation:
                    return False  # the deadline passed; the watchdog already counted this attempt
                self.current = None
            latency_ms = (time.monotonic() - started) * 1000
            if failure is None:
                self.task.settle(delivery, ACCEPTED, None, outputs, latency_ms, inflight)
                return True
            if final or attempt >= s.delivery_limit:
                self.task.dead_letter(delivery, failure, first_ms, latency_ms, inflight)
                return True
            self.task.report(delivery, RELEASED, failure, latency_ms, inflight)
            attempt += 1
            wait_ms = retry_delay_ms(attempt - 1, s.backoff_ms, s.max_backoff_ms)

    def watch(self, now: float) -> None:
        """Give up on a call past its deadline: count the attempt failed and go on in a new thread."""
        s = self.task.settings
        with self.lock:
            call = self.current
            if call is None or now - call.started < s.lock_ms / 1000:
                return
            self.generation += 1
            self.current = None
        failure = Failure("Timeout", f"handler ran past its deadline of {s.lock_ms / 1000:g}s")
        latency_ms = (now - call.started) * 1000
        if call.attempt >= s.delivery_limit:
            self.task.dead_letter(call.record, failure, call.first_ms, latency_ms, 0)
            self._start(None)
            return
        self.task.report(call.record, RELEASED, failure, latency_ms, 0)
        delay = retry_delay_ms(call.attempt, s.backoff_ms, s.max_backoff_ms)
        self._start((call.record, call.attempt + 1, call.first_ms, delay))


class PartitionTask:
    """One Kafka partition's records of one micro-batch: slots, the offset tracker, commits."""

    def __init__(self, process: WorkerProcess, topic: str, partition: int):
        self.process = process
        self.settings = s = process.settings
        self.topic, self.partition = topic, partition
        self.tracker = ContiguousOffsets()
        self._outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._inflight = 0
        self._error: BaseException | None = None
        self._pending: list[ProducedRecord] = []  # exactly-once: released outputs awaiting the next transaction
        self.writer = TransactionalWriter(process, topic, partition) if s.exactly_once else None
        self.committed = process.committed(topic, partition)  # after the writer fenced any predecessor
        self.last_commit = self.committed
        count = 1 if s.ordering == "partition" else s.slots
        self.slots = [Slot(self, i) for i in range(count)]
        # A slot's queue holds Slot.DEPTH chunks of this size: maxInFlight records of the partition at
        # most wait in queues, beside the chunk each slot is working through.
        self.chunk = max(1, s.slot_queue // Slot.DEPTH)
        self._next_slot = 0
        self._slot_of: dict[bytes | None, int] = {}  # FNV-1a of a key, once per key
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="qp-watch", daemon=True)
        self._watcher.start()

    # -- reading -----------------------------------------------------------------------------
    def feed(self, records: list[Record]) -> None:
        """Records of this partition in offset order: skip what the group already committed, hand
        the rest to their slots in chunks."""
        if self.committed is not None and records[0].offset < self.committed:
            for record in records:
                if record.offset < self.committed:
                    self.report(record, SKIPPED, None, 0.0, 0)
            records = [r for r in records if r.offset >= self.committed]
            if not records:
                return
        self.tracker.add([r.offset for r in records])
        per_slot: list[list[Record]] = [[] for _ in self.slots]
        if len(self.slots) == 1:
            per_slot[0] = records
        elif self.settings.ordering == "none":
            for record in records:
                per_slot[self._next_slot].append(record)
                self._next_slot = (self._next_slot + 1) % len(self.slots)
        else:
            slot_of = self._slot_of
            if len(slot_of) > MAX_CACHED_KEYS:
                slot_of.clear()
            for record in records:
                index = slot_of.get(record.key)
                if index is None:
                    index = slot_of[record.key] = key_slot(record.key, len(self.slots))
                per_slot[index].append(record)
        # Chunks go out round by round, one per slot, so every slot gets work before any slot's
        # full queue holds the reader back.
        step = self.chunk
        for start in range(0, max(len(mine) for mine in per_slot), step):
            for slot, mine in zip(self.slots, per_slot, strict=True):
                if start < len(mine):
                    self._put(slot, mine[start : start + step])

    def _put(self, slot: Slot, item: list[Record] | None) -> None:
        """A full slot queue holds the reader back (backpressure), unless the task has failed."""
        while True:
            self.raise_if_failed()
            try:
                slot.queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def finish(self, end: int) -> None:
        """Wait for every slot to drain, then commit up to ``end`` (the offset after the last record)."""
        for slot in self.slots:
            self._put(slot, None)
        for slot in self.slots:
            while not slot.finished.wait(0.2):
                self.raise_if_failed()
        self._done.set()
        self._watcher.join()
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while self.tracker.unfinished and time.monotonic() < deadline:  # outputs still being acknowledged
            self.raise_if_failed()
            time.sleep(0.005)
        self.raise_if_failed()
        if self.tracker.unfinished:
            raise RuntimeError(f"outputs of {self.topic}[{self.partition}] not acknowledged in {COMMIT_TIMEOUT_S:.0f}s")
        self.commit(end)
        if self.writer is not None:
            self.writer.close()

    # -- outcomes ----------------------------------------------------------------------------
    def inflight(self, step: int) -> int:
        with self._lock:
            self._inflight += step
            return self._inflight

    def report(self, record: Record, outcome: str, failure: Failure | None, latency_ms: float, inflight: int) -> None:
        row = Outcome.of(record, outcome, failure, latency_ms, inflight)
        with self._lock:
            self._outcomes.append(row)

    def settle(
        self,
        record: Record,
        outcome: str,
        failure: Failure | None,
        produced: list[ProducedRecord],
        latency_ms: float,
        inflight: int,
    ) -> None:
        """A record is done: its writes become durable (now, or in the next transaction), then it counts as complete."""
        self.report(record, outcome, failure, latency_ms, inflight)
        if self.writer is not None or not produced:
            self.tracker.complete(record.offset, produced)
            return
        remaining = [len(produced)]

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self.fail(RuntimeError(f"write for {record.topic}[{record.partition}]@{record.offset} failed: {err}"))
                return
            remaining[0] -= 1
            if remaining[0] == 0:
                self.tracker.complete(record.offset, None)

        for item in produced:
            produce(self.process.producer, item, delivered)

    def dead_letter(self, record: Record, failure: Failure, first_ms: int, latency_ms: float, inflight: int) -> None:
        now_ms = int(time.time() * 1000)
        dead = dead_letter_record(record, self.settings.dlq_topic, record.delivery_count, failure, first_ms, now_ms)
        self.settle(record, DEAD_LETTERED, failure, [dead], latency_ms, inflight)

    def drain(self) -> list[Outcome]:
        with self._lock:
            rows, self._outcomes = self._outcomes, []
        return rows

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc

    def abandon(self) -> None:
        """The task failed: drop what the slots still hold and let their threads end."""
        self.fail(RuntimeError("task ended"))
        self._done.set()
        for slot in self.slots:
            slot.backlog.clear()
            with contextlib.suppress(queue.Empty):
                while True:
                    slot.queue.get_nowait()
            with contextlib.suppress(queue.Full):
                slot.queue.put_nowait(None)

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"{self.topic}[{self.partition}]: {self._error}") from self._error

    # -- progress ----------------------------------------------------------------------------
    def _watch(self) -> None:
        last_commit = time.monotonic()
        while not self._done.wait(WATCH_INTERVAL_S):
            now = time.monotonic()
            for slot in self.slots:
                slot.watch(now)
            if now - last_commit >= self.settings.commit_interval_ms / 1000:
                last_commit = now
                try:
                    self.commit(None)
                except Exception as exc:
                    self.fail(exc)

    def commit(self, end: int | None) -> None:
        """Commit the completed prefix (all of it, up to ``end``, once the batch is done)."""
        released = self.tracker.advance(end)
        for produced in released:
            if produced:
                self._pending.extend(produced)
        mark = self.tracker.watermark
        if mark is None or (self.last_commit is not None and mark <= self.last_commit):
            return
        if self.writer is not None:
            self.writer.commit(self._pending, TopicPartition(self.topic, self.partition, mark))
            self._pending = []
        else:
            self.process.commit(self.topic, self.partition, mark)
        self.last_commit = mark


PROCESSES: PerProcess[WorkerProcess] = PerProcess(lambda text: WorkerProcess(ConsumerSettings.from_json(text)))


def input_records(
    batch: pa.RecordBatch, delivery_count: Callable[[tuple[tuple[str, bytes | None], ...]], int] | None = None
) -> list[Record]:
    """An Arrow batch of INPUT_COLUMNS as records; ``delivery_count`` reads it from the headers (kmq), else 1."""
    column = batch.column
    raw_headers = column("headers")
    if len(raw_headers.flatten()) == 0:  # no record of the batch has headers: skip converting them
        headers: Iterable[tuple[tuple[str, bytes | None], ...]] = repeat((), batch.num_rows)
    else:
        headers = [tuple((h["key"], h["value"]) for h in raw) if raw else () for raw in raw_headers.to_pylist()]
    if delivery_count is None:
        counts: Iterable[int] = repeat(1, batch.num_rows)
    else:
        headers = list(headers)
        counts = [delivery_count(h) for h in headers]
    return list(
        map(
            Record.make,
            column("key").to_pylist(),
            column("value").to_pylist(),
            headers,
            column("topic").to_pylist(),
            column("partition").to_pylist(),
            column("offset").to_pylist(),
            counts,
            column("ts").to_pylist(),
        )
    )


def _records_by_partition(batch: pa.RecordBatch) -> list[tuple[tuple[str, int], list[Record]]]:
    """An Arrow batch of INPUT_COLUMNS as records, grouped by Kafka partition in offset order."""
    groups: dict[tuple[str, int], list[Record]] = {}
    for record in input_records(batch):
        group = groups.get((record.topic, record.partition))
        if group is None:
            group = groups[(record.topic, record.partition)] = []
        group.append(record)
    return list(groups.items())


def run_partition(settings_json: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: the records of one Kafka partition in offset order in, outcome rows out."""
    process = PROCESSES.get(settings_json)
    tasks: dict[tuple[str, int], PartitionTask] = {}
    ends: dict[tuple[str, int], int] = {}
    try:
        for batch in batches:
            for tp, records in _records_by_partition(batch):
                task = tasks.get(tp)
                if task is None:
                    task = tasks[tp] = PartitionTask(process, *tp)
                task.feed(records)
                ends[tp] = records[-1].offset + 1
            rows = [row for task in tasks.values() for row in task.drain()]
            if rows:
                yield outcome_batch(rows)
        for tp, task in tasks.items():
            task.finish(ends[tp])
        rows = [row for task in tasks.values() for row in task.drain()]
        if rows:
            yield outcome_batch(rows)
    except BaseException:
        for task in tasks.values():  # a retried task starts over from the group's offset
            task.abandon()
        raise
