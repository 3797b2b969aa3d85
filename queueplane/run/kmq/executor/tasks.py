"""The kmq runtime inside Spark's Python workers: a task is a run of records the process's group
member (member.py) polled, up to ``maxInFlight`` a partition.

A task writes the ``start`` markers of all its records and waits until they are durable,
then hands the records to its process's handler threads. Each record ends one way:

- accepted: its outputs are produced and acknowledged, then its ``end`` marker;
- rejected, or failed on its last delivery: its DLQ record is durable, then its ``end`` marker;
- failed earlier: a ``retry`` marker (the tracker redelivers after backoff);
- still running at start + lockDuration: given up; its result is dropped when the call
  returns, and the tracker redelivers it (no ``end`` marker), a delivery counted;
- not started by then: a ``release`` marker; the tracker redelivers it, the delivery uncounted.

The task returns when every record ended or was given up. The member then commits the group's
offsets past the task's records: from then on, redelivery is the tracker's job.

A write reported refused shared its record batch with others, and the broker refuses a batch
whole: it is only a suspect (queueplane.run.executor.failed_writes), written again alone before its
record is turned into a dead letter or its dead letter is parked; taken alone, the record ends
as it would have.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from itertools import groupby
from operator import attrgetter
from typing import Any

from queueplane.handler_api import Handler, InvalidOutput, Record, Reject, outputs_of
from queueplane.run.consumer.executor.process import MemberSettings
from queueplane.run.dead_letters import Failure, failure_of_headers
from queueplane.run.executor.crash_journal import DEAD, CrashJournal, Delivery, journal_folder, worker_died
from queueplane.run.executor.failed_writes import AloneWrites, FailedWrites, alone_writes, fingerprint
from queueplane.run.executor.handler import load_handler
from queueplane.run.executor.memory_guard import guard
from queueplane.run.executor.outputs import output_record
from queueplane.run.executor.processes import ServedProducer
from queueplane.run.executor.retry import retry_delay_ms
from queueplane.run.kmq import markers as km
from queueplane.run.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    DELIVERY_TIMEOUT_S,
    DUPLICATE,
    RELEASED,
    SETTLE_EVERY,
    SETTLE_WITHIN_S,
    Outcome,
    ProducedRecord,
    dead_letter_record,
    is_parked,
    parked_record,
    produce,
    refused_write,
    unparked_dead_letter,
)
from queueplane.run.parking import PARKED, REFUSALS, cause_of, refused_failure

log = logging.getLogger("queueplane.worker")
WAIT_STEP_S = 0.05
# A retried task starts a delivery's clock again with a new start marker only this far before
# the old lock runs out: the marker must be durable, and read by the tracker, before it looks.
TRACKER_MARGIN_MS = 1000


@dataclass(frozen=True, kw_only=True)
class KmqSettings(MemberSettings):
    """Everything a task needs, sent from the driver as JSON (no spec parsing on executors)."""

    markers_topic: str
    threads: int
    backoff_ms: int
    max_backoff_ms: int
    max_in_flight: int  # records of a partition one task takes at most


# A write's failure: the task fails / the record's refused writes are suspects, written again alone.
FAILED, TURNED = "failed", "turned"


class _Ending:
    """A record whose writes were produced: its marker is due once they are durable. ``refused``:
    its writes reported refused, each with why, once any was (``TURNED``); ``dead``: they are its
    dead letter (parked when refused alone), else its outputs (it becomes a dead letter)."""

    __slots__ = ("at", "dead", "delay", "failed", "index", "kind", "refused")

    def __init__(self, index: int, kind: str, delay: int):
        self.index, self.kind, self.delay = index, kind, delay
        self.at = time.monotonic()
        self.failed: str | None = None
        self.refused: list[tuple[ProducedRecord, InvalidOutput]] = []
        self.dead = False


# An accepted call without outputs, waiting in its thread's run: its index, row and end marker.
_Quick = tuple[int, Outcome, _Ending]


class HandlerThreads:
    """The process's handler threads. A call given up keeps its thread; a new one takes its place.

    A job is a turn at a task's queue of records: the thread takes records from it until none
    are left. A task hands out one turn per thread rather than one job per record, so a record
    costs a ``popleft`` instead of a put and a get on the shared job queue (its lock and
    condition), and a thread stuck in a call holds only that record, since the others keep
    taking from the same queue.
    """

    def __init__(self, size: int):
        self.size = size
        self.jobs: queue.SimpleQueue[KmqTask] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._alive = 0
        self.add(size)

    def add(self, count: int) -> None:
        with self._lock:
            self._alive += count
        for _ in range(count):
            threading.Thread(target=self._loop, name="qp-kmq-handler", daemon=True).start()

    def _loop(self) -> None:
        while True:
            task = self.jobs.get()
            try:
                task.run_queued()
            except BaseException:  # a bug must not cost the process a handler thread
                log.exception("a kmq handler thread failed a record; continuing")
            with self._lock:
                if self._alive > self.size:  # stood in for a stuck call that has now returned
                    self._alive -= 1
                    return


class KmqProcess:
    """One per Python worker process and queue: the handler, its threads, the producer."""

    def __init__(self, settings: KmqSettings):
        self.settings = settings
        # The process's member of the group, and the group's metadata (transactions): kmq has none.
        self.group: Any = None
        self.group_metadata: Any = None
        self.handler: Handler = load_handler(settings.handler, settings.search_paths)
        # Durability is learnt in rounds (``ServedProducer.all_delivered``), not per record, and
        # markers carry no callback of their own: a failed one is counted here (failed_writes).
        self.failed_writes = FailedWrites()
        self.delivery = ServedProducer(
            settings.kafka,
            linger_ms=2,
            batch_bytes=settings.batch_bytes,
            errors_only=True,
            on_failed=self.failed_writes,
        )
        self.producer = self.delivery.producer
        self.threads = HandlerThreads(settings.threads)
        self.alone: AloneWrites = alone_writes(settings.kafka)  # suspects written again, each alone
        self.journal = CrashJournal(journal_folder(settings.group_id), settings.lock_ms / 1000)
        self.memory_guard = guard(settings.memory_limit_mi, self.journal.ending)

    def close(self) -> None:
        self.delivery.close()
        self.journal.close()


class KmqTask:
    """The records of one task: start markers, handler calls, the way each ends."""

    def __init__(self, process: KmqProcess, records: list[Record]):
        self.process = process
        self.settings = process.settings
        self.records = records
        self._lock = threading.Lock()
        self._claimed = [False] * len(records)  # an outcome was decided (ended, released, given up)
        self._running: dict[int, float] = {}
        # Each handler thread's quick records (accepted, no outputs) not yet settled (``_settle_run``).
        self._runs: list[list[_Quick]] = []
        self._unsettled = len(records)  # records whose marker (or give-up) is not yet sent
        self._settled = threading.Condition(self._lock)
        self._ending: list[_Ending] = []  # writes sent; each marker goes once the writes are durable
        # Cleared while the task thread waits for a moment with nothing in flight: under steady
        # writes that moment may not come by itself, and a marker must not wait past the lock.
        self._may_produce = threading.Event()
        self._may_produce.set()
        self._hold_after_s = self.settings.lock_ms / 1000 * km.LATE_END_SHARE  # no later than the tracker waits for it
        self._outcomes: list[Outcome] = []
        self._error: str | None = None
        self._write_failures = process.failed_writes.failures  # failures before this task are not its own
        self._queued: deque[int] = deque()  # records not yet taken by a handler thread, in call order
        self._turned: set[int] = set()  # records turned into dead letters that way (once each)
        # Records no process died in whose markers are not yet sent: a crash suspect waits for them.
        self._innocent_open: set[int] = set()
        self.confirming: list[threading.Thread] = []  # refused writes being written again alone
        self.deadline = 0.0

    def start(self) -> None:
        """Write the start markers, durable, and only then let the handlers at the records."""
        now_ms = int(time.time() * 1000)
        self.first_ms = now_ms
        taken = self._taken_by_tracker(now_ms)
        starting = [r for i, r in enumerate(self.records) if i not in taken] if taken else self.records
        runs: dict[km.RunKey, list[int]] = {}
        # A task's records come by partition in offset order: a few runs, gathered at C speed.
        for (partition, count), run in groupby(starting, attrgetter("partition", "delivery_count")):
            runs.setdefault((partition, km.START, count, now_ms, 0), []).extend(map(attrgetter("offset"), run))
        self._write_durably(runs)
        # The tracker counts from the marker's time; the worker gives up no later than that.
        self.deadline = time.monotonic() + self.settings.lock_ms / 1000 - (time.time() - now_ms / 1000)
        with self._lock:
            for index in taken:
                self._give_up(index, 0.0, "its process died in the call, and its lock ran out before the retry")
        order = self._call_order()
        crashes = self.process.journal.crashes
        innocent = set(order).difference(taken)
        if crashes:  # the rare case: no record a per-record look on the quick path
            innocent = {i for i in innocent if not self._crashes_of(i, crashes)}
        with self._lock:
            self._innocent_open = innocent
        self._queued.extend(index for index in order if index not in taken)
        threads = self.process.threads
        for _ in range(min(threads.size, len(self._queued))):
            threads.jobs.put(self)

    def _taken_by_tracker(self, now_ms: int) -> set[int]:
        """Copies this task's last attempt died in, whose lock has run out since: the tracker's.

        The tracker times such a delivery out and redelivers or dead-letters it. Started again
        here, the message would end twice (and a start marker would open the delivery again).
        Such a copy gets no marker and no call.
        """
        crashed = self.process.journal.crashed_deliveries
        if not crashed:
            return set()
        due_ms = now_ms + TRACKER_MARGIN_MS - self.settings.lock_ms
        return {
            index
            for index, record in enumerate(self.records)
            if crashed.get((record.partition, record.offset), due_ms + 1) <= due_ms
        }

    def _call_order(self) -> list[int]:
        """The records' indices, suspects last and the most suspected of them last of all.

        A suspect runs alone: the calls running end first, and none starts until it returns. If
        it kills its process, every record of this task not yet ended comes back from the tracker
        one delivery later; so the innocent records go before it, and end before it runs.
        """
        crashes = self.process.journal.crashes
        if not crashes:
            return list(range(len(self.records)))

        return sorted(range(len(self.records)), key=lambda index: self._crashes_of(index, crashes))

    def _crashes_of(self, index: int, crashes: dict[tuple[int, int], int]) -> int:
        """How many processes died in calls of the record's message (counted where it was first produced)."""
        if not crashes:
            return 0
        record = self.records[index]
        where = km.origin(record.headers, record.topic, record.partition, record.offset)
        return crashes.get((where.partition, where.offset), 0)

    def _innocents_ended(self, index: int) -> None:
        """Before a crash suspect's call: until every other record of the task ended for good
        (its marker durable), or half the time left before the deadline has passed.

        The journal lets a suspect start once the other calls have returned, but a record whose
        call returned may still be writing: its outputs, a refused write taken again alone, its
        dead letter, its end marker. If the suspect kills the process meanwhile, that record's
        delivery is lost with it, and a record that only ever ran beside killers would end as a
        ``Timeout`` at its delivery limit. The wait is bounded, so that a suspect still gets its
        call within its lock when an innocent record hangs.
        """
        until = time.monotonic() + max(0.0, self.deadline - time.monotonic()) / 2
        with self._lock:
            # Without itself: a crash collected after the task began makes a suspect of a record
            # that began as an innocent.
            self._settled.wait_for(lambda: not self._innocent_open - {index}, max(0.0, until - time.monotonic()))
        self.process.delivery.all_delivered(max(0.0, until - time.monotonic()))

    # -- handler threads -----------------------------------------------------------------------
    def run_queued(self) -> None:
        """Records from the task's queue until it is empty (deque.popleft is atomic).

        Accepted calls without outputs, nearly every call of a quick handler, wait in ``done``
        and settle in runs (``SETTLE_EVERY``, ``SETTLE_WITHIN_S``): the task's lock once a run,
        not twice a record, which 16 threads taking it in turn made the costliest line of the
        worker. A run is settled before a call that may wait on others (a crash suspect's), and
        the task's own thread settles every thread's run at the deadline, before it gives up the
        calls still running: a thread may never come back from its call.
        """
        queued = self._queued
        done: list[_Quick] = []
        with self._lock:
            self._runs.append(done)
        began = 0.0  # when the run's first record was accepted
        try:
            while True:
                try:
                    index = queued.popleft()
                except IndexError:
                    return
                quick = self.run(index, done)
                if quick is not None:
                    accepted = quick[2].at
                    if not done:
                        began = accepted
                    done.append(quick)
                    if len(done) >= SETTLE_EVERY or accepted - began >= SETTLE_WITHIN_S:
                        self._settle_quick(done)
                elif done and time.monotonic() - began >= SETTLE_WITHIN_S:  # aged behind slower ends
                    self._settle_quick(done)
        finally:
            with self._lock:
                self._settle_run(done)
                self._runs.remove(done)

    def _settle_quick(self, done: list[_Quick]) -> None:
        with self._lock:
            self._settle_run(done)

    def _settle_run(self, done: list[_Quick]) -> None:
        """Caller holds the lock: the run's records end (row, end marker) unless given up meanwhile.

        Taken from the front, not swapped for a new list: the task's thread settles a stuck
        thread's run at the deadline while that thread may append to it (both atomic)."""
        taken = done[:]
        if not taken:
            return
        del done[: len(taken)]
        claimed, running, outcomes, ending = self._claimed, self._running, self._outcomes, self._ending
        for index, row, end in taken:
            running.pop(index, None)
            if claimed[index]:
                continue  # given up at the deadline: the tracker redelivers it
            claimed[index] = True
            outcomes.append(row)
            ending.append(end)
        self._round_if_all_ended()

    def run(self, index: int, done: list[_Quick]) -> _Quick | None:
        """One record's call and how it ends. An accepted call without outputs is returned for
        its thread's run (``run_queued``); every other end is settled here."""
        record = self.records[index]
        if record.headers and is_parked(record.headers):
            self._parked_to_dlq(index)
            return None
        # Crashes are counted per message (where it was first produced): the tracker's copies of
        # a record that killed its process are the same message. A first delivery has no headers.
        journal = self.process.journal
        where = km.origin(record.headers, record.topic, record.partition, record.offset) if record.headers else None
        partition, offset = (where.partition, where.offset) if where else (record.partition, record.offset)
        crashes = journal.crashes.get((partition, offset), 0) if journal.crashes else 0
        if crashes >= self.settings.delivery_limit:
            self._ended_by_crashes(index, crashes, where or km.Origin(record.topic, partition, offset, None))
            return None
        if crashes:
            self._settle_quick(done)  # the suspect waits for the innocent records to end, these too
            self._innocents_ended(index)
        # Without the lock, in this order: running first, then claimed. The task's thread at the
        # deadline claims first, then reads running. Either it sees this call running and gives
        # it up (its result is dropped), or this thread sees it claimed and makes no call: a
        # record is never both released and called.
        started = time.monotonic()
        self._running[index] = started
        if self._claimed[index]:
            self._running.pop(index, None)
            return None
        if started >= self.deadline:
            with self._lock:
                self._running.pop(index, None)
                if not self._claimed[index]:
                    self._release(index)
            return None
        s = self.settings
        failure: Failure | None = None
        final = False
        outputs: list[ProducedRecord] = []
        try:
            delivery = Delivery(record.partition, record.offset, self.first_ms)
            result = journal.call(partition, offset, self.process.handler, record, delivery=delivery)
            outputs = [output_record(o, record, s.output_topic) for o in outputs_of(result)]
        except Reject as exc:
            failure, final = Failure.of(exc), True
        except BaseException as exc:  # Retry, any other exception, sys.exit(): another delivery, unless the last
            failure = Failure.of(exc)
            final = record.delivery_count >= s.delivery_limit
        latency_ms = (time.monotonic() - started) * 1000
        if failure is None and not outputs:
            return index, Outcome.accepted(record, latency_ms, 0), _Ending(index, km.END, 0)
        with self._lock:
            self._running.pop(index, None)
            if self._claimed[index]:
                return None  # given up at the deadline: the tracker redelivers it
            self._claimed[index] = True
        if failure is None:
            self._report(record, ACCEPTED, None, latency_ms)
            try:
                self._write_then_end(index, outputs, km.END)
            except InvalidOutput as exc:  # refused before it was sent: the outputs cannot be written
                with self._lock:
                    first = index not in self._turned
                    self._turned.add(index)
                if first:
                    self._dead_letter(index, Failure.of(exc), latency_ms)
        elif final:
            self._dead_letter(index, failure, latency_ms)
        else:
            self._report(record, RELEASED, failure, latency_ms)
            self._write_then_end(index, [], km.RETRY)
        return None

    def _ended_by_crashes(self, index: int, crashes: int, where: km.Origin) -> None:
        """A message whose calls killed ``deliveryLimit`` processes: to the DLQ once, without another call;
        a copy of it the tracker produced meanwhile just ends, a duplicate, not a second end of the message.

        The copy that went to the DLQ comes again in a retry of its task, whose rows died with
        its process (and its DLQ write may have): it is dead-lettered again, at least once as
        any write, so it is counted and in the DLQ."""
        with self._lock:
            if self._claimed[index]:
                return
            self._claimed[index] = True
        record = self.records[index]
        journal, key, copy = self.process.journal, (where.partition, where.offset), (record.partition, record.offset)
        if crashes >= DEAD:
            if journal.dead_at.get(key) != copy:
                self._report(record, DUPLICATE, None, 0.0)
                self._write_then_end(index, [], km.END)
                return
            crashes = self.settings.delivery_limit  # its count went when it was dead-lettered
        self.records[index] = replace(record, delivery_count=crashes)
        self._dead_letter(index, worker_died(crashes, journal.reasons.get(key)), 0.0)
        journal.dead_lettered(where.partition, where.offset, copy)

    def _dead_letter(self, index: int, failure: Failure, latency_ms: float) -> None:
        """The record's DLQ record, durable, then its end marker. A record whose outputs the broker
        refused was reported accepted already: that row gives way to this one."""
        record, s = self.records[index], self.settings
        with self._lock:
            self._outcomes = [o for o in self._outcomes if (o.partition, o.offset) != (record.partition, record.offset)]
        self._report(record, DEAD_LETTERED, failure, latency_ms)
        where = km.origin(record.headers, record.topic, record.partition, record.offset)
        at_origin = replace(record, topic=where.topic, partition=where.partition, offset=where.offset)
        now_ms = int(time.time() * 1000)
        first_ms = where.first_attempt_ms or self.first_ms
        dead = dead_letter_record(at_origin, s.dlq_topic, record.delivery_count, failure, first_ms, now_ms)
        self._write_then_end(index, [dead], km.END)

    def _parked_to_dlq(self, index: int) -> None:
        """A parked record is a dead letter already: to the DLQ as it is, without a call."""
        with self._lock:
            if self._claimed[index]:
                return
            self._claimed[index] = True
        record = self.records[index]
        self._report(record, DEAD_LETTERED, failure_of_headers(record.headers), 0.0)
        self._write_then_end(index, [unparked_dead_letter(record, self.settings.dlq_topic)], km.END)

    def _confirm_refused(self, ending: _Ending) -> None:
        """The record's writes reported refused, each written again alone (on a thread of its own):
        all taken, the record ends as it would have (its row stands); one refused alone turns
        its outputs into a dead letter, or parks its dead letter. Any other failure fails the
        task (its records come again, from the task's retry or the tracker)."""
        index = ending.index
        try:
            why = self.process.alone.first_refusal([item for item, _ in ending.refused])
        except RuntimeError as exc:
            self._fail_unsettled(index, str(exc))
            return
        if why is None:
            self._write_then_end(index, [], km.END)
        elif ending.dead:
            self._park(index, ending.refused[0][0], str(why))
        else:
            with self._lock:
                first = index not in self._turned
                self._turned.add(index)
            if first:
                self._dead_letter(index, Failure.of(why), 0.0)
            else:  # its dead letter's outputs cannot be refused: a second turn means a fault here
                self._fail_unsettled(index, f"outputs of {self.records[index].offset} refused twice: {why}")

    def _fail_unsettled(self, index: int, error: str) -> None:
        """The record cannot end in this task: the task fails (its records come again)."""
        record = self.records[index]
        with self._lock:
            if self._error is None:
                self._error = f"write for {record.partition}:{record.offset}: {error}"
            self._unsettled -= 1
            self._innocent_open.discard(index)
            self._settled.notify_all()

    def _park(self, index: int, dead: ProducedRecord, why: str) -> None:
        """The DLQ refused ``dead`` alone: write it to the queue's topic, parked (alone, and
        acknowledged), then the end marker. A task meets it there later and tries the DLQ again
        (``_parked_to_dlq``); the record holds nothing back meanwhile. A parked copy that fails
        too fails the task (its records come again, from the task's retry or the tracker)."""
        record, s = self.records[index], self.settings
        where = f"{record.topic}-{record.partition}@{record.offset}"
        try:
            park_refused = self.process.alone.refusal(parked_record(dead, record.topic))
        except RuntimeError as exc:
            park_refused = InvalidOutput(str(exc))
        if park_refused is not None:
            REFUSALS.error(
                cause_of(s.dlq_topic, why) + f" / {cause_of(record.topic, park_refused)}",
                f"DLQ write failed for {where} ({why}) and parking it failed ({park_refused}): retrying",
            )
            self._fail_unsettled(index, f"DLQ write refused ({why}), and parking it failed: {park_refused}")
            return
        failure = refused_failure(PARKED, why)
        with self._lock:
            self._outcomes = [o for o in self._outcomes if (o.partition, o.offset) != (record.partition, record.offset)]
        self._report(record, RELEASED, failure, 0.0)
        REFUSALS.error(
            cause_of(s.dlq_topic, why),
            f"DLQ write failed for {where} ({why}): parked in {record.topic} until the DLQ takes it",
        )
        self._write_then_end(index, [], km.END)

    def _write_then_end(self, index: int, writes: list[ProducedRecord], kind: str) -> None:
        """Produce the record's writes; its marker follows in the task thread's next round in
        which every write produced so far is acknowledged (``_end_round``)."""
        record = self.records[index]
        s = self.settings
        delay = int(retry_delay_ms(record.delivery_count, s.backoff_ms, s.max_backoff_ms)) if kind == km.RETRY else 0
        ending = _Ending(index, kind, delay)
        # Only an END's outputs turn into a dead letter when refused; a refused DLQ record is parked.
        turnable = kind == km.END and bool(writes) and writes[0][0] != s.dlq_topic
        ending.dead = kind == km.END and len(writes) == 1 and writes[0][0] == s.dlq_topic
        if writes:
            on_error = functools.partial(self._write_failed, ending, turnable or ending.dead, writes)
            self._may_produce.wait()
            for item in writes:
                produce(self.process.producer, item, on_error)
        with self._lock:
            self._add_ending(ending)

    def _add_ending(self, ending: _Ending) -> None:
        """Caller holds the lock: the record's marker goes in the task thread's next round."""
        self._ending.append(ending)
        self._round_if_all_ended()

    def _round_if_all_ended(self) -> None:
        """Caller holds the lock: with every unsettled record's marker due, the round can go now."""
        if len(self._ending) >= self._unsettled:
            self._settled.notify_all()

    def _write_failed(
        self, ending: _Ending, turnable: bool, writes: list[ProducedRecord], err: object, msg: Any
    ) -> None:
        """On the delivery thread, for a write the broker or client failed: the record gets no
        marker from it. A refused output or dead letter (``turnable``) is a suspect, written again
        alone once every write so far is acknowledged (``_end_round``); any other failure fails
        the task (its records come back from the tracker)."""
        index = ending.index
        refused = refused_write(err) if turnable else None
        with self._lock:
            if refused is None or ending.failed == FAILED:
                ending.failed = FAILED
                if self._error is None:
                    record = self.records[index]
                    self._error = f"write for {record.partition}:{record.offset}: {err}"
                return
            ending.failed = TURNED
            print_ = fingerprint(msg.topic(), msg.key(), msg.value())
            item = next((w for w in writes if fingerprint(w[0], w[1], w[2]) == print_), None)
            if item is not None:
                ending.refused.append((item, refused))

    def _end_round(self, within_s: float) -> None:
        """The markers of the records whose writes are durable now: every write produced so far
        is acknowledged, and the failed ones' callbacks have run, so what is left succeeded."""
        with self._lock:
            ending, self._ending = self._ending, []
        if not ending:
            return
        delivery = self.process.delivery
        if not delivery.all_delivered(within_s):
            if time.monotonic() - ending[0].at < self._hold_after_s:
                with self._lock:  # a busy producer: the next round, with more
                    self._ending[:0] = ending
                return
            self._may_produce.clear()
            try:
                durable = delivery.all_delivered(DELIVERY_TIMEOUT_S)
            finally:
                self._may_produce.set()
            if not durable:
                raise RuntimeError(f"writes not acknowledged within {DELIVERY_TIMEOUT_S:.0f}s")
        now_ms = int(time.time() * 1000)
        settled = 0
        runs: dict[km.RunKey, list[int]] = {}
        records = self.records
        turned = [item for item in ending if item.failed == TURNED]
        for item in ending:
            if item.failed == TURNED:  # every report of its writes is in: its suspects go again alone
                continue  # it ends again, once they are
            settled += 1
            if item.failed is None:
                record = records[item.index]
                key = (record.partition, item.kind, record.delivery_count, now_ms, item.delay)
                runs.setdefault(key, []).append(record.offset)
        self._produce_markers(runs)
        with self._lock:
            self._unsettled -= settled
            if self._innocent_open:
                self._innocent_open.difference_update(item.index for item in ending if item.failed != TURNED)
                self._settled.notify_all()
        if turned:
            # On a thread of their own: the handler threads may all be held by crash suspects
            # that wait for these records to end (_innocents_ended).
            thread = threading.Thread(target=self._confirm_all, args=(turned,), name="qp-kmq-alone", daemon=True)
            self.confirming.append(thread)
            thread.start()

    def _confirm_all(self, turned: list[_Ending]) -> None:
        """The round's records whose writes were refused, one after another; a record whose
        confirmation fails cannot end in this task (its records come again)."""
        for item in turned:
            try:
                self._confirm_refused(item)
            except BaseException as exc:
                self._fail_unsettled(item.index, f"{type(exc).__name__}: {exc}")

    def _produce_markers(self, runs: dict[km.RunKey, list[int]]) -> None:
        """Into their records' partitions of the markers topic, a record a run (``markers.run_records``),
        without a callback of their own: the process's producer counts a failed one (``_markers_failed``)."""
        producer, topic = self.process.producer, self.settings.markers_topic
        for partition, key, value in km.run_records(runs):
            produce(producer, (topic, key, value, []), partition=partition)

    def _markers_failed(self) -> str | None:
        """Why a write of this process failed since the task began, if one did. Outputs and dead
        letters call back for themselves, so it was a marker, this task's or another's: either
        way this task fails, and its records come again (a duplicate at worst, never a loss).
        Read once the producer acknowledged everything, so every failure so far is counted."""
        failed = self.process.failed_writes
        return failed.last_failure if failed.failures != self._write_failures else None

    def _write_durably(self, runs: dict[km.RunKey, list[int]]) -> None:
        """The start markers, acknowledged before any handler runs; only this task produces now."""
        self._produce_markers(runs)
        if not self.process.delivery.all_delivered(DELIVERY_TIMEOUT_S):
            raise RuntimeError(f"start markers not acknowledged within {DELIVERY_TIMEOUT_S:.0f}s")
        with self._lock:
            error = self._error or self._markers_failed()
        if error is not None:
            raise RuntimeError(error)

    def _give_up(self, index: int, latency_ms: float, why: str) -> None:
        """Caller holds the lock. No marker: the tracker sees a start without end and redelivers."""
        self._unsettled -= 1
        self._innocent_open.discard(index)
        self._settled.notify_all()
        self._timed_out(index, latency_ms, why)

    def _release(self, index: int) -> None:
        """Caller holds the lock. Its deadline came before any call: a ``release`` marker, in the
        next round, has the tracker redeliver it without counting this delivery. Should the
        marker reach the tracker too late, the delivery times out and counts, as a given-up one."""
        self._timed_out(index, 0.0, "not started within lockDuration")
        self._add_ending(_Ending(index, km.RELEASE, 0))

    def _timed_out(self, index: int, latency_ms: float, why: str) -> None:
        """Caller holds the lock: the record's outcome is decided, a release at its lock's end."""
        self._claimed[index] = True
        failure = Failure("Timeout", f"{why} ({self.settings.lock_ms / 1000:g}s)")
        self._outcomes.append(Outcome.of(self.records[index], RELEASED, failure, latency_ms, 0))

    def _report(self, record: Record, outcome: str, failure: Failure | None, latency_ms: float) -> None:
        with self._lock:
            self._outcomes.append(Outcome.of(record, outcome, failure, latency_ms, 0))

    # -- the task's own thread ---------------------------------------------------------------
    def wait(self) -> None:
        """Until every record is settled; at the deadline, give up what has not ended."""
        self._settle(self.deadline, 0.0)
        with self._lock:
            for done in self._runs:  # accepted before the deadline: they end
                self._settle_run(done)
            stuck = 0
            now = time.monotonic()
            for index, claimed in enumerate(self._claimed):
                if not claimed:
                    self._claimed[index] = True  # before reading running: see ``run``
                    started = self._running.get(index)
                    if started is None:
                        self._release(index)
                        continue
                    stuck += 1
                    self._give_up(index, (now - started) * 1000, "ran past lockDuration")
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        self._settle(deadline, WAIT_STEP_S)
        markers_durable = self.process.delivery.all_delivered(max(0.0, deadline - time.monotonic()))
        with self._lock:
            error = self._error or (self._markers_failed() if markers_durable else None)
            if error is None and self._unsettled > 0:
                error = f"{self._unsettled} writes not acknowledged within {DELIVERY_TIMEOUT_S:.0f}s"
            if error is None and not markers_durable:
                error = f"markers not acknowledged within {DELIVERY_TIMEOUT_S:.0f}s"
        if stuck:
            self.process.threads.add(stuck)
        if error is not None:
            raise RuntimeError(error)

    def _settle(self, until: float, within_s: float) -> None:
        """Rounds of markers (each waiting up to ``within_s`` for the producer) until every
        record is settled or ``until`` (monotonic) has passed."""
        while True:
            self._end_round(within_s)
            with self._lock:
                if self._unsettled <= 0 or time.monotonic() >= until:
                    return
                self._settled.wait(WAIT_STEP_S)

    def drain(self) -> list[Outcome]:
        with self._lock:
            rows, self._outcomes = self._outcomes, []
        return rows
