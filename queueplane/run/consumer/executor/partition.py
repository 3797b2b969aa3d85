"""One Kafka partition's work inside a consumer queue's member (member.py): ``PartitionTask``.

The member hands a partition's task its records in offset order. The task
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

A dead letter the DLQ refuses (too large for it: refused on every try alike) is parked: a copy
with the DLQ's headers and ``HEADER_PARKED`` goes to the end of its record's own partition
before the offset passes the record, in the same transaction under exactlyOnce (the refused
one is aborted and written again with the parked copy in the dead letter's place). A worker
that meets a parked record writes it to the DLQ without a handler call.

At-least-once, a write reported refused shared its record batch with others, and the broker
refuses a batch whole: it is only a suspect (queueplane.run.executor.failed_writes), written again alone
before its record is turned into a dead letter or its dead letter is parked. Written again, it
lands after the outputs of records handled later; the handler calls kept their order.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

from confluent_kafka import TopicPartition

from queueplane.handler_api import InvalidOutput, Record
from queueplane.run.consumer.executor.ordering import ContiguousOffsets, key_slot
from queueplane.run.consumer.executor.process import TransactionalWriter, WorkerProcess
from queueplane.run.consumer.executor.slots import Done, QuickProduce, Slot
from queueplane.run.dead_letters import Failure, failure_of_headers
from queueplane.run.executor.failed_writes import alone_writes
from queueplane.run.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    DELIVERY_TIMEOUT_S,
    RELEASED,
    SKIPPED,
    Outcome,
    OutcomeColumns,
    ProducedRecord,
    accepted_runs,
    columns_of,
    dead_letter_record,
    error_text,
    is_parked,
    joined_columns,
    parked_record,
    produce,
    refused_write,
    unparked_dead_letter,
)
from queueplane.run.parking import PARKED, REFUSALS, cause_of, refused_failure

log = logging.getLogger("queueplane.worker")

WATCH_INTERVAL_S = 0.05
MAX_CACHED_KEYS = 100_000

# What the offset tracker holds for a completed record at-least-once: a slot's ``Done`` (a plain
# tuple) for one accepted on the quick path, kept as it came so that no outcome is made per
# record; an ``Outcome`` for any other.
Settled = Done | Outcome
_RECORD, _LATENCY, _INFLIGHT = itemgetter(0), itemgetter(2), itemgetter(3)


@dataclass(slots=True)
class TxnWrites:
    """exactlyOnce: a done record's writes for the next transaction, and its row, shown once that
    transaction committed. What it writes changes when the broker refuses a record of it
    (``PartitionTask._turn_refused``); ``partition`` pins a parked copy to its record's own
    partition, and ``refused`` says why the DLQ refused its dead letter."""

    record: Record
    row: Outcome
    produced: list[ProducedRecord]
    partition: int | None = None
    refused: str | None = None


class PartitionTask:
    """One Kafka partition's records of one micro-batch: slots, the offset tracker, commits."""

    def __init__(self, process: WorkerProcess, topic: str, partition: int, watch_commits: bool = True):
        """``watch_commits``: the task's watcher commits every ``commit_interval_ms``; a group
        member commits from its consumer's thread instead (member.py), so it passes False."""
        self.process = process
        self.watch_commits = watch_commits
        # A group member's note of each commit's range and rows before it is made (unreported.py),
        # and the notes' tokens, taken with the rows they count.
        self.before_commit: Callable[[int, int, int, int], int] | None = None
        self.commit_tokens: list[int] = []
        self.settings = s = process.settings
        self.topic, self.partition = topic, partition
        self.tracker = ContiguousOffsets()
        self._outcomes: list[OutcomeColumns] = []  # the rows of committed records, shown
        self._reported: list[Outcome] = []  # outcomes shown at once (skipped, released for a retry)
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._pending: list[TxnWrites] = []  # exactly-once: released records awaiting the next transaction
        self._refused: list[tuple[Record, Failure, float, int]] = []  # outputs refused: to the DLQ next
        # Dead letters the DLQ refused, to park in the queue's topic before their offsets are
        # committed; and the offsets parked, whose rows say so once they are shown.
        self._unparked: list[tuple[Record, ProducedRecord, str]] = []
        self._parked: dict[int, Failure] = {}
        # At-least-once: records released from the tracker, shown once their writes are
        # acknowledged; records settled one by one whose outputs went to the producer, by offset,
        # with the outputs, until they are committed (the broker may refuse one until then; a
        # quick path's ``Done`` carries its outputs itself).
        self._awaiting: list[Settled] = []
        self._written: dict[int, tuple[Record, list[ProducedRecord]]] = {}
        self._write_errors = process.failed_writes.errors  # failures before this task are not its own
        self.alone = alone_writes(s.kafka)  # suspects written again, each in a batch of its own
        self.writer = TransactionalWriter(process, topic, partition) if s.exactly_once else None
        # At-least-once: a slot's quick path hands outputs to the producer itself (``quick_produce``)
        # and settles its accepted records in runs (``settled``).
        self.quick_produce: QuickProduce | None = self._quick_produce if self.writer is None else None
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
        if self._has_parked(records):
            records = [r for r in records if not self._parked_to_dlq(r)]
            if not records:
                return
        per_slot: list[list[Record]] = [[] for _ in self.slots]
        if len(self.slots) == 1:
            per_slot[0] = records
        else:
            indices, self._next_slot = self._slots_for(records, self._next_slot)
            for record, index in zip(records, indices, strict=True):
                per_slot[index].append(record)
        # Chunks go out round by round, one per slot, so every slot gets work before any slot's
        # full queue holds the reader back.
        step = self.chunk
        for start in range(0, max(len(mine) for mine in per_slot), step):
            for slot, mine in zip(self.slots, per_slot, strict=True):
                if start < len(mine):
                    self._put(slot, mine[start : start + step])

    def take(self, records: list[Record]) -> int:
        """Feed the longest prefix of ``records`` that the slots' queues have room for now,
        without waiting; how many that was. The member's one thread feeds every partition it
        holds, polls and commits: a busy slot that held it back in ``feed`` stopped all of that,
        and a member with a slow handler and a skewed key ran at a third of its slots' pace. The
        rest waits with the member, and the partition is as slow as its busiest slot."""
        free = [(Slot.DEPTH - slot.queue.qsize()) * self.chunk for slot in self.slots]
        committed = self.committed
        if len(self.slots) == 1 and (committed is None or records[0].offset >= committed):
            taken = min(len(records), free[0])  # one slot, nothing to skip: no record to look at
        else:
            fresh = records if committed is None else [r for r in records if r.offset >= committed]
            indices = iter(self._slots_for(fresh, self._next_slot)[0])
            taken = 0
            for record in records:
                if committed is None or record.offset >= committed:  # a skipped record takes no room
                    index = next(indices)
                    if free[index] <= 0:
                        break
                    free[index] -= 1
                taken += 1
        if taken:
            self.feed(records[:taken])
        return taken

    def _slots_for(self, records: list[Record], next_slot: int) -> tuple[list[int], int]:
        """Each record's slot, as ``feed`` hands them out from round-robin position ``next_slot``
        (ordering none), by key (ordering key) or all to the one slot; and the next position."""
        count = len(self.slots)
        if count == 1:
            return [0] * len(records), next_slot
        if self.settings.ordering == "none":
            indices = [(next_slot + i) % count for i in range(len(records))]
            return indices, (next_slot + len(records)) % count
        slot_of = self._slot_of
        if len(slot_of) > MAX_CACHED_KEYS:
            slot_of.clear()
        indices = []
        for record in records:
            index = slot_of.get(record.key)
            if index is None:
                index = slot_of[record.key] = key_slot(record.key, count)
            indices.append(index)
        return indices, next_slot

    @staticmethod
    def _has_parked(records: list[Record]) -> bool:
        """Whether any record is parked; most batches have no headers at all."""
        return any(r.headers and is_parked(r.headers) for r in records)

    def _parked_to_dlq(self, record: Record) -> bool:
        """A parked record is a dead letter already: to the DLQ as it is, without a handler call,
        and without a slot (it was handled in its turn; the partition's order is about calls)."""
        if not is_parked(record.headers):
            return False
        dead = unparked_dead_letter(record, self.settings.dlq_topic)
        self.settle(record, DEAD_LETTERED, failure_of_headers(record.headers), [dead], 0.0, 0)
        return True

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
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while self.tracker.unfinished and time.monotonic() < deadline:  # refused outputs turning into dead letters
            self.raise_if_failed()
            self._dead_letter_refused()
            time.sleep(0.005)
        self.raise_if_failed()
        if self.tracker.unfinished or not self.commit(end, within_s=max(0.0, deadline - time.monotonic())):
            within = f"{DELIVERY_TIMEOUT_S:.0f}s"
            raise RuntimeError(f"outputs of {self.topic}[{self.partition}] not acknowledged in {within}")
        if self.writer is not None:
            self.writer.close()

    # -- outcomes ----------------------------------------------------------------------------
    def calls_running(self) -> int:
        """Handler calls of this task's slots now, for the rows' inflight (a call given up past its
        deadline no longer counts). Read without a lock: a count of the moment, not a counter."""
        if len(self.slots) == 1:
            return 1  # asked by the one slot as it starts a call
        return len(self.slots) - [slot.current for slot in self.slots].count(None)

    def report(self, record: Record, outcome: str, failure: Failure | None, latency_ms: float, inflight: int) -> None:
        row = Outcome.of(record, outcome, failure, latency_ms, inflight)
        with self._lock:
            self._reported.append(row)

    def settle(
        self,
        record: Record,
        outcome: str,
        failure: Failure | None,
        produced: list[ProducedRecord],
        latency_ms: float,
        inflight: int,
    ) -> None:
        """A record is done: it completes now, and its writes become durable before its offset is committed.

        exactlyOnce writes them in the next transaction, and shows the record's row once that
        transaction committed (``_commit_transaction``). At-least-once hands them to the producer
        here, and ``commit`` waits until the producer has acknowledged everything before it
        commits or shows the rows. No write carries a callback of its own: the process's
        producer reports the few that fail (failed_writes), and the record's fingerprints let
        ``commit`` find its own among them.

        An output the broker refuses (InvalidOutput: too large, not writable) turns the record
        into a dead letter instead, written before its offset is committed. A dead letter the
        DLQ refuses is parked in the queue's topic, also before its offset is committed
        (``_park_refused``).
        """
        if self.writer is not None:
            row = Outcome.of(record, outcome, failure, latency_ms, inflight)
            self.tracker.complete(record.offset, TxnWrites(record, row, produced))
            return
        row = (
            Outcome.accepted(record, latency_ms, inflight)
            if outcome == ACCEPTED
            else Outcome.of(record, outcome, failure, latency_ms, inflight)
        )
        if not produced:
            self.tracker.complete(record.offset, row)
            return
        if outcome == DEAD_LETTERED:
            self._write_dead_letter(record, produced[0])
            self.tracker.complete(record.offset, row)
            return
        if not self._quick_produce(record, produced, latency_ms, inflight):
            return
        # Before it completes: ``commit`` reads it once the tracker releases the row.
        self._written[record.offset] = (record, produced)
        self.tracker.complete(record.offset, row)

    def _quick_produce(self, record: Record, produced: list[ProducedRecord], latency_ms: float, inflight: int) -> bool:
        """An accepted record's outputs to the producer; False when one was refused before it was
        sent: the record is then not complete until its dead letter is written."""
        delivery = self.process.delivery
        if not delivery.writes_open:  # a commit is learning what is durable (member._commit_all)
            delivery.wait_to_write()
        producer = self.process.producer
        try:
            for item in produced:
                produce(producer, item)
        except InvalidOutput as exc:
            with self._lock:
                self._refused.append((record, Failure.of(exc), latency_ms, inflight))
            return False
        return True

    def settled(self, done: list[Done]) -> None:
        """Records a slot accepted on its quick path, their outputs with the producer: their
        offsets complete, all at once, each with its ``Done`` as it came (its record, outputs,
        latency and calls in flight: what its row and a refused output need)."""
        self.tracker.complete_many([record.offset for record, _, _, _ in done], done)

    def _write_dead_letter(self, record: Record, dead: ProducedRecord) -> None:
        """A DLQ record, with a callback of its own (dead letters are few). One the DLQ refuses
        (too large, invalid: refused on every try alike) is parked before the commit passes its
        offset; any other failure fails the task, and the record comes again."""
        where = f"{record.topic}[{record.partition}]@{record.offset}"

        def failed(err: Any, _msg: Any) -> None:
            refused = refused_write(err)
            if refused is None:
                self.fail(RuntimeError(f"DLQ write for {where}: {err}"))
                return
            with self._lock:
                self._unparked.append((record, dead, str(refused)))

        try:
            produce(self.process.producer, dead, failed)
        except InvalidOutput as exc:
            with self._lock:
                self._unparked.append((record, dead, str(exc)))

    def _park_refused(self) -> None:
        """Park the dead letters the DLQ refused (on a thread that is not the producer's).

        A dead letter reported refused may only have shared its batch with one the DLQ refuses:
        it is written again alone first, and parked only when the DLQ refuses it alone. A parked
        copy goes to the end of its record's own partition, written alone too (and acknowledged
        before this returns), where the worker meets it again and tries the DLQ once more
        (``_parked_to_dlq``): a dead letter the DLQ refuses holds back neither the partition nor
        the records after it. Called once the producer acknowledged every write so far, so every
        refusal below the commit's offset is here. A parked copy refused too fails the task: the
        record comes again, and so do its tries.
        """
        with self._lock:
            unparked, self._unparked = self._unparked, []
        dlq = self.settings.dlq_topic
        for record, dead, _ in unparked:
            where = f"{record.topic}[{record.partition}]@{record.offset}"
            refused = self.alone.refusal(dead)  # any other failure fails the task: the record comes again
            if refused is None:
                continue  # in the DLQ after all
            why = str(refused)
            park_refused = self.alone.refusal(parked_record(dead, record.topic), record.partition)
            if park_refused is not None:
                REFUSALS.error(
                    cause_of(dlq, why) + f" / {cause_of(self.topic, park_refused)}",
                    f"DLQ write failed for {where} ({why}) and parking it failed ({park_refused}): retrying",
                )
                raise RuntimeError(f"DLQ write for {where} refused ({why}), and parking it failed: {park_refused}")
            self._parked[record.offset] = refused_failure(PARKED, why)
            REFUSALS.error(
                cause_of(dlq, why),
                f"DLQ write failed for {where} ({why}): parked at the end of {record.topic}[{record.partition}] "
                "until the DLQ takes it",
            )

    def _commit_transaction(self, writer: TransactionalWriter, mark: int) -> None:
        """The pending records' writes and the offset ``mark`` in one transaction; their rows then."""
        pending = self._pending
        writer.commit(pending, TopicPartition(self.topic, self.partition, mark), self._turn_refused)
        self._pending = []
        for entry in pending:
            if entry.refused is not None and entry.partition is not None:
                record = entry.record
                REFUSALS.error(
                    cause_of(self.settings.dlq_topic, entry.refused),
                    f"DLQ write failed for {record.topic}[{record.partition}]@{record.offset} ({entry.refused}): "
                    f"parked at the end of {record.topic}[{record.partition}] until the DLQ takes it",
                )
        self._show(columns_of([entry.row for entry in pending]))

    def _turn_refused(self, entry: TxnWrites, why: InvalidOutput) -> None:
        """A record of ``entry`` was refused in its transaction, which is written again: what the
        entry writes instead. A refused output makes the record a dead letter, as at-least-once;
        a refused dead letter is parked in the record's own partition, never both; a refused
        parked copy fails the task, and the record comes again (so do its tries)."""
        record, row = entry.record, entry.row
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        if entry.partition is not None:
            dlq_why = entry.refused or ""
            REFUSALS.error(
                cause_of(self.settings.dlq_topic, dlq_why) + f" / {cause_of(self.topic, why)}",
                f"DLQ write failed for {where} ({dlq_why}) and parking it failed ({why}): retrying",
            )
            raise RuntimeError(f"DLQ write for {where} refused ({dlq_why}), and parking it failed: {why}")
        if row.outcome == DEAD_LETTERED:
            (dead,) = entry.produced
            entry.produced = [parked_record(dead, record.topic)]
            entry.partition = record.partition
            entry.refused = str(why)
            entry.row = row._replace(outcome=RELEASED, error=error_text(refused_failure(PARKED, str(why))))
            return
        failure = Failure.of(why)
        now_ms = int(time.time() * 1000)
        first_ms = now_ms - int(row.latency_ms)
        dead = dead_letter_record(record, self.settings.dlq_topic, record.delivery_count, failure, first_ms, now_ms)
        entry.produced = [dead]
        entry.row = Outcome.of(record, DEAD_LETTERED, failure, row.latency_ms, row.inflight)

    def _shown(self, settled: list[Settled]) -> OutcomeColumns:
        """The rows of records about to be shown: the quick path's accepted ones in runs read
        straight from their ``Done``s, the others from their outcomes (those of parked records
        say where their dead letters went)."""
        kinds = list(map(type, settled))
        if kinds.count(tuple) == len(settled):  # the usual commit: every record quick
            return _done_columns(cast(list[Done], settled))
        done = cast(list[Done], [item for item, kind in zip(settled, kinds, strict=True) if kind is tuple])
        rows = cast(list[Outcome], [item for item, kind in zip(settled, kinds, strict=True) if kind is not tuple])
        if self._parked:
            parked = self._parked
            rows = [
                row._replace(outcome=RELEASED, error=error_text(parked.pop(row.offset)))
                if row.offset in parked and row.outcome == DEAD_LETTERED
                else row
                for row in rows
            ]
        return joined_columns([_done_columns(done), columns_of(rows)] if done else [columns_of(rows)])

    def _show(self, block: OutcomeColumns) -> None:
        """Rows for the next slice to collect (a commit that passed only transaction markers has none)."""
        if block[0]:
            with self._lock:
                self._outcomes.append(block)

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

    def _turn_refused_outputs(self, mark: int) -> bool:
        """Records among the awaiting ones whose output the broker refused go to the DLQ instead,
        their rows with them; True when it wrote dead letters, which the commit waits for too.

        Called once the producer acknowledged every write so far, so every refusal of an
        awaiting record's outputs has been reported (failed_writes). A refused output is written
        again alone first (``AloneWrites``): taken, its record stays accepted; only an output
        refused alone turns its record into a dead letter. ``mark``: every awaiting record is
        below it."""
        failed, written = self.process.failed_writes, self._written
        if not failed.refusals:  # the usual case: nothing of this process's was refused
            for offset in [offset for offset in written if offset < mark]:
                del written[offset]
            return False
        kept: list[Settled] = []
        turned = 0
        now_ms = int(time.time() * 1000)
        for item in self._awaiting:
            if isinstance(item, Outcome):
                entry = written.pop(item.offset, None)
                latency_ms, inflight = item.latency_ms, item.inflight
            else:  # a quick path's Done
                record, produced, latency_ms, inflight = item
                entry = (record, produced) if produced else None
            suspects = failed.claim_each(entry[1]) if entry is not None else None
            # Any failure but a refusal fails the task: the record comes again.
            why = self.alone.first_refusal([output for output, _ in suspects]) if entry and suspects else None
            if entry is None or why is None:
                kept.append(item)
                continue
            record, failure = entry[0], Failure.of(why)
            first_ms = now_ms - int(latency_ms)
            dead = dead_letter_record(record, self.settings.dlq_topic, record.delivery_count, failure, first_ms, now_ms)
            self._write_dead_letter(record, dead)
            kept.append(Outcome.of(record, DEAD_LETTERED, failure, latency_ms, inflight))
            turned += 1
        self._awaiting = kept
        return turned > 0

    def _raise_if_writes_failed(self) -> None:
        """A write of this process failed since the task began (not a refusal): it may have been
        one of this task's, so none of its offsets may be committed; the records come again."""
        failed = self.process.failed_writes
        if failed.errors != self._write_errors:
            self.fail(RuntimeError(failed.last_error))
            self.raise_if_failed()

    def _note_commit(self, mark: int, rows: int) -> None:
        if self.before_commit is None or not rows:
            return
        first = self.last_commit if self.last_commit is not None else -1
        token = self.before_commit(self.partition, first, mark, rows)
        with self._lock:
            self.commit_tokens.append(token)

    def drain_noted(self) -> tuple[list[OutcomeColumns], list[int]]:
        """The rows shown so far, and the tokens of the commit notes that count them."""
        with self._lock:
            blocks, self._outcomes = self._outcomes, []
            reported, self._reported = self._reported, []
            tokens, self.commit_tokens = self.commit_tokens, []
        if reported:
            blocks.append(columns_of(reported))
        return blocks, tokens

    def drain(self) -> list[OutcomeColumns]:
        with self._lock:
            blocks, self._outcomes = self._outcomes, []
            reported, self._reported = self._reported, []
        if reported:
            blocks.append(columns_of(reported))
        return blocks

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
            if self.watch_commits and now - last_commit >= self.settings.commit_interval_ms / 1000:
                try:
                    if self.commit(None):
                        last_commit = now
                except Exception as exc:
                    self.fail(exc)

    def commit(self, end: int | None, within_s: float = 0.0) -> bool:
        """Commit the completed prefix (all of it, up to ``end``, once the batch is done).

        At-least-once commits only once the producer has acknowledged every write so far, so
        the prefix's outputs are durable; False when that did not happen within ``within_s``
        (a busy producer mid-batch: a later tick tries again with a longer prefix).
        """
        released = self.tracker.advance(end)
        if self.writer is not None:
            self._pending.extend(released)
        else:
            self._awaiting.extend(released)
        mark = self.tracker.watermark
        if mark is None or (self.last_commit is not None and mark <= self.last_commit):
            return True
        if self.writer is not None:
            self._note_commit(mark, len(self._pending))
            self._commit_transaction(self.writer, mark)
        else:
            delivery = self.process.delivery
            if not delivery.all_delivered(within_s):
                return False
            self._raise_if_writes_failed()
            self.raise_if_failed()
            if self._turn_refused_outputs(mark) and not delivery.all_delivered(within_s):
                return False  # the dead letters are not acknowledged yet: the next try commits
            self.raise_if_failed()
            self._park_refused()
            self._note_commit(mark, len(self._awaiting))
            self.process.commit(self.topic, self.partition, mark)
            self._show(self._shown(self._awaiting))
            self._awaiting = []
        self.last_commit = mark
        return True


def _done_columns(done: list[Done]) -> OutcomeColumns:
    """The rows of records the quick path accepted, from their ``Done``s a field a pass."""
    return accepted_runs(list(map(_RECORD, done)), list(map(_LATENCY, done)), list(map(_INFLIGHT, done)))
