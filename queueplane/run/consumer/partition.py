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
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import TopicPartition

from queueplane.run.consumer.ordering import ContiguousOffsets, key_slot
from queueplane.run.consumer.process import ConsumerSettings, TransactionalWriter, WorkerProcess
from queueplane.run.consumer.slots import Slot
from queueplane.run.dead_letters import Failure
from queueplane.run.handler import InvalidOutput, Record
from queueplane.run.kafka_input import input_records
from queueplane.run.outcomes import (
    DEAD_LETTERED,
    SKIPPED,
    Outcome,
    ProducedRecord,
    dead_letter_record,
    outcome_batch,
    produce,
    refused_write,
)
from queueplane.run.processes import PerProcess

log = logging.getLogger("queueplane.worker")

WATCH_INTERVAL_S = 0.05
MAX_CACHED_KEYS = 100_000
COMMIT_TIMEOUT_S = 30.0


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
        self._refused: list[tuple[Record, Failure, float, int]] = []  # outputs refused: to the DLQ next
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
            self._dead_letter_refused()
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
        """A record is done: its writes become durable (now, or in the next transaction), then it counts as complete.

        Without a transaction the outcome row waits for the writes: an output the broker refuses
        (InvalidOutput: too large, not writable) turns the record into a dead letter instead, on
        the watcher's thread, while the task goes on. A refused dead letter fails the task: its
        offset is not committed and the record comes again.
        """
        if self.writer is not None or not produced:
            self.report(record, outcome, failure, latency_ms, inflight)
            self.tracker.complete(record.offset, produced)
            return
        remaining = [len(produced)]
        refused = [False]  # one dead letter per record, however many of its outputs were refused

        def turn_dead(why: InvalidOutput) -> None:
            if outcome == DEAD_LETTERED:
                self.fail(RuntimeError(f"DLQ write for {record.topic}[{record.partition}]@{record.offset}: {why}"))
            elif not refused[0]:
                refused[0] = True
                with self._lock:
                    self._refused.append((record, Failure.of(why), latency_ms, inflight))

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                why = refused_write(err)
                if why is None:
                    where = f"{record.topic}[{record.partition}]@{record.offset}"
                    self.fail(RuntimeError(f"write for {where} failed: {err}"))
                else:
                    turn_dead(why)
                return
            remaining[0] -= 1
            if remaining[0] == 0 and not refused[0]:
                self.report(record, outcome, failure, latency_ms, inflight)
                self.tracker.complete(record.offset, None)

        try:
            for item in produced:
                produce(self.process.producer, item, delivered)
        except InvalidOutput as exc:
            turn_dead(exc)

    def _dead_letter_refused(self) -> None:
        """Records whose outputs the broker refused go to the DLQ (on the watcher's thread: never
        on the producer's delivery thread, which a full producer queue would wait for)."""
        with self._lock:
            refused, self._refused = self._refused, []
        now_ms = int(time.time() * 1000)
        for record, failure, latency_ms, inflight in refused:
            self.dead_letter(record, failure, now_ms - int(latency_ms), latency_ms, inflight)

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
            self._dead_letter_refused()
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
    process.journal.collect()  # a process that died in a call of this task's last attempt
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
