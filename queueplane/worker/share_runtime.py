"""The share-group runtime that runs inside Spark's Python workers (KIP-932).

Each worker process keeps its ShareConsumers for its whole life, so consumers stay group
members across micro-batches instead of joining and leaving every batch; they leave the
group when the process exits. The fetchers run continuously in background threads while
the driver holds a lease on them, so Spark's pause between two micro-batches costs no
throughput; a micro-batch task renews the lease, waits one time slice and takes the
outcomes settled meanwhile. Per record: the handler runs under a deadline shorter than
the acquisition lock, outputs and dead-letter records are made durable, and only then is
the record acknowledged (ACCEPT, RELEASE or REJECT) and the acknowledgement committed.
The last micro-batch of a run drains: fetchers stop acquiring, settle what they hold and
report it, so a stopped worker leaves nothing acquired and nothing unreported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from confluent_kafka import AcknowledgeType, KafkaException, Message, ShareConsumer

from queueplane.dlq import Failure
from queueplane.handler import Handler, Output, Record, Reject, load_handler, outputs_of
from queueplane.worker.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    DELIVERY_TIMEOUT_S,
    RELEASED,
    Outcome,
    ProducedRecord,
    dead_letter_record,
    output_record,
    produce_and_wait,
)
from queueplane.worker.processes import PerProcess, ServedProducer
from queueplane.worker.settings import JsonSettings

log = logging.getLogger("queueplane.worker")

HANDLER_SHARE_OF_LOCK = 0.7  # a handler gets 70% of the lock; the rest is for outputs and the ack
FETCHER_SHARE = 4  # one ShareConsumer per this many handler threads (at least two a process)
# A poll may acquire this many rounds of the pool's threads: fewer fetch round trips per record
# (a quick handler's throughput was bound by them at 8 records a poll), while the pool's room
# check keeps acquired records from queueing behind a busy pool.
POLL_ROUNDS = 8
ROOM_ROUNDS = 4
# Fetchers keep acquiring this long past a batch's time slice, to bridge the driver's pause
# before the next batch; without a renewal they stop and only settle what they hold.
LEASE_GRACE_S = 3.0


@dataclass(frozen=True)
class ShareSettings(JsonSettings):
    """Everything an executor needs, sent from the driver as JSON (no spec parsing on executors)."""

    kafka: dict[str, str]
    queue: str
    topic: str
    group_id: str
    dlq_topic: str
    output_topic: str | None
    lock_ms: int
    delivery_limit: int
    handler: str
    search_paths: list[str] = field(default_factory=list)
    slots: int = 8
    max_poll_records: int = 5
    batch_ms: int = 1000


class _Call:
    """One handler call handed to the pool; the fetcher that owns the record settles it.

    State changes happen under the call's poll condition. A call the fetcher gave up on
    (deadline passed) is abandoned: if the handler returns later, its outputs are dropped,
    so a released record never also produces output.
    """

    QUEUED, RUNNING, PRODUCING, DONE, ABANDONED = range(5)
    __slots__ = ("deadline", "inflight", "poll", "record", "result", "started", "started_wall", "state")

    def __init__(self, record: Record, poll: _Poll, deadline: float):
        self.record = record
        self.poll = poll
        self.deadline = deadline
        self.state = _Call.QUEUED
        self.result: tuple[str, Failure | None] | None = None
        self.inflight = 0
        self.started = time.monotonic()
        self.started_wall = 0.0


class _Poll:
    """The calls of one poll: the fetcher waits on one condition for all of them, not on each."""

    __slots__ = ("cond", "unsettled")

    def __init__(self, size: int):
        self.cond = threading.Condition(threading.Lock())
        self.unsettled = size

    def settle(self, call: _Call, state: int, result: tuple[str, Failure | None] | None) -> bool:
        """Move a call to DONE or ABANDONED once; False if it was settled already. Caller holds cond."""
        if call.state in (_Call.DONE, _Call.ABANDONED):
            return False
        call.state, call.result = state, result
        self.unsettled -= 1
        if self.unsettled == 0:
            self.cond.notify_all()
        return True


class HandlerPool:
    """``size`` daemon threads running handler calls for every fetcher of the process.

    A call stuck past its deadline keeps its thread (a Python thread cannot be stopped);
    the pool starts a replacement so the number of usable threads stays ``size``.
    """

    def __init__(self, runtime: ProcessRuntime, size: int):
        self.runtime = runtime
        self.size = size
        self.calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # notified when queued calls fall below ROOM_ROUNDS rounds
        self.live = 0
        self.inflight = 0
        self.queued = 0  # calls handed in and not yet taken by a thread
        for _ in range(size):
            self._spawn()

    def submit(self, calls: list[_Call]) -> None:
        with self.lock:
            self.queued += len(calls)
        put = self.calls.put
        for call in calls:
            put(call)

    def wait_for_room(self, timeout: float) -> bool:
        """Whether fewer calls wait than ROOM_ROUNDS rounds of the threads (waiting up to ``timeout``).

        Fetchers acquire more records only then: records acquired while the pool is far behind
        would wait in its queue while their acquisition lock runs down. A few rounds stay
        queued, so the threads have work while a fetcher's poll is on its way.
        """
        with self.room:
            return self.room.wait_for(lambda: self.queued < ROOM_ROUNDS * self.size, timeout)

    def _spawn(self) -> None:
        with self.lock:
            self.live += 1
        threading.Thread(target=self._loop, name="qp-handler", daemon=True).start()

    def replace_stuck(self) -> None:
        self._spawn()

    def _loop(self) -> None:
        while True:
            call = self.calls.get()
            self._run(call)
            with self.lock:
                if self.live > self.size:  # a replacement took this thread's place while it was stuck
                    self.live -= 1
                    return

    def _run(self, call: _Call) -> None:
        with self.lock:
            self.queued -= 1
            if self.queued == ROOM_ROUNDS * self.size - 1:
                self.room.notify_all()
        poll = call.poll
        with poll.cond:
            if call.state != _Call.QUEUED:
                return  # the fetcher gave up on it while it waited in the queue
            if time.monotonic() >= call.deadline:
                poll.settle(
                    call, _Call.DONE, (RELEASED, Failure("Timeout", "the lock ran out before the handler started"))
                )
                return
            call.state = _Call.RUNNING
        call.started_wall = time.time()
        with self.lock:
            self.inflight += 1
            call.inflight = self.inflight
        try:
            outputs = outputs_of(self.runtime.handler(call.record))
            if outputs:
                with poll.cond:
                    if call.state == _Call.ABANDONED:
                        return
                    call.state = _Call.PRODUCING
                self.runtime.produce_and_wait([self.runtime.output_record(o, call.record) for o in outputs])
            result: tuple[str, Failure | None] = (ACCEPTED, None)
        except Reject as exc:
            result = (DEAD_LETTERED, Failure.of(exc))
        except Exception as exc:  # Retry and any other exception: another delivery, unless this was the last
            result = (RELEASED, Failure.of(exc))
        finally:
            with self.lock:
                self.inflight -= 1
        with poll.cond:
            poll.settle(call, _Call.DONE, result)


class ProcessRuntime:
    """One per Python worker process and queue: producer, handler, handler pool and fetchers."""

    def __init__(self, settings: ShareSettings):
        self.settings = settings
        self.handler: Handler = load_handler(settings.handler, settings.search_paths)
        self.delivery = ServedProducer(settings.kafka, linger_ms=1)
        self.producer = self.delivery.producer
        self.pool = HandlerPool(self, settings.slots)
        self.fetchers: list[ShareFetcher] = []
        # When a record's first failed delivery started in this process, for the DLQ headers (bounded).
        self.first_attempts: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._first_lock = threading.Lock()
        self._batch_lock = threading.Lock()
        # The lease: fetchers acquire records only before ``_lease_until`` (monotonic seconds).
        self._lease = threading.Condition()
        self._lease_until = 0.0
        self._outbox: list[Outcome] = []
        self._outbox_lock = threading.Lock()

    def first_attempt(self, record: Record, now_ms: int) -> int:
        key = (record.topic, record.partition, record.offset)
        with self._first_lock:
            first = self.first_attempts.setdefault(key, now_ms)
            self.first_attempts.move_to_end(key)
            while len(self.first_attempts) > 100_000:
                self.first_attempts.popitem(last=False)
            return first

    def output_record(self, output: Output, record: Record) -> ProducedRecord:
        return output_record(output, record, self.settings.output_topic)

    def produce_and_wait(self, records: list[ProducedRecord]) -> None:
        produce_and_wait(self.producer, records)

    def run_batch(self, final: bool = False) -> list[Outcome]:
        """Renew the lease for one time slice and return what the fetchers settled meanwhile.

        ``final`` drains instead: the lease ends now, every fetcher settles and commits what it
        holds, and the task returns all of it, so the driver can stop with nothing in flight.
        """
        with self._batch_lock:  # two tasks in one process never share fetchers
            # At least two: one polls while the other waits for the tail of its poll.
            wanted = max(2, -(-self.settings.slots // FETCHER_SHARE))
            while len(self.fetchers) < wanted:
                self.fetchers.append(ShareFetcher(self, len(self.fetchers)))
            slice_s = self.settings.batch_ms / 1000
            if final:
                with self._lease:
                    self._lease_until = 0.0
                    self._lease.notify_all()
                    limit = time.monotonic() + self.settings.lock_ms / 1000 + DELIVERY_TIMEOUT_S
                    self._lease.wait_for(lambda: not any(f.busy for f in self.fetchers), limit - time.monotonic())
            else:
                with self._lease:
                    self._lease_until = time.monotonic() + slice_s + LEASE_GRACE_S
                    self._lease.notify_all()
                time.sleep(slice_s)
            with self._outbox_lock:
                settled, self._outbox = self._outbox, []
            return settled

    def leased(self) -> bool:
        return time.monotonic() < self._lease_until

    def enter_cycle(self, fetcher: ShareFetcher) -> bool:
        """Mark the fetcher busy if it may poll (lease held) or must commit (lease ended with
        acknowledgements pending); otherwise wait a little for a renewal and say no."""
        with self._lease:
            if self.leased() or fetcher.pending:
                fetcher.busy = True
                return True
            self._lease.wait(0.5)
            return False

    def leave_cycle(self, fetcher: ShareFetcher, outcomes: list[Outcome]) -> None:
        if outcomes:
            with self._outbox_lock:
                self._outbox.extend(outcomes)
        with self._lease:
            fetcher.busy = False
            self._lease.notify_all()

    def close(self) -> None:
        with self._lease:
            self._lease_until = 0.0
            self._lease.notify_all()
        for fetcher in self.fetchers:
            fetcher.close()
        self.delivery.close()


class ShareFetcher:
    """A ShareConsumer in explicit acknowledgement mode feeding the process's handler pool.

    Its thread hands every record of a poll to the pool at once, so one slow record does
    not hold up the others locked by the same poll, and acknowledges each as soon as its
    outcome is durable; acknowledgements ride on the next poll, or are committed when the
    lease ends or time runs short.
    """

    def __init__(self, runtime: ProcessRuntime, index: int):
        from queueplane.cluster import quiet_logger

        self.runtime = runtime
        self.index = index
        s = runtime.settings
        self.consumer = ShareConsumer(
            {
                **s.kafka,
                "group.id": s.group_id,
                "share.acknowledgement.mode": "explicit",
                "max.poll.records": s.max_poll_records,
                "client.id": f"queueplane-{s.queue}-{os.getpid()}-{index}",
                "logger": quiet_logger(),
            }
        )
        self.consumer.subscribe([s.topic])
        self.busy = False
        self.pending = False  # acknowledgements not yet committed
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"qp-fetch-{index}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed:
            if not self.runtime.enter_cycle(self):
                continue
            outcomes: list[Outcome] = []
            try:
                if self.runtime.leased():
                    self._cycle(outcomes)
                if self.pending and not self.runtime.leased():
                    # The lease ended: nothing stays uncommitted. A failed commit is not retried
                    # forever; the broker redelivers whatever it did not record.
                    self._commit()
                    self.pending = False
            except Exception:  # a fetcher thread must outlive any one bad poll
                log.exception("share fetcher %d failed a poll; continuing", self.index)
                time.sleep(0.2)
            finally:
                self.runtime.leave_cycle(self, outcomes)

    def _cycle(self, outcomes: list[Outcome]) -> None:
        """One poll: hand its records to the pool, settle them together, acknowledge each."""
        if not self.runtime.pool.wait_for_room(0.05):
            if self.pending:  # acknowledgements must not wait for the pool: their records' locks run
                self.pending = not self._commit()
            return
        try:
            messages = self.consumer.poll(0.2)
        except KafkaException as exc:
            log.warning("share poll failed: %s", exc)
            time.sleep(0.2)
            return
        if not messages:
            return
        polled_at = time.monotonic()
        lock_s = self.runtime.settings.lock_ms / 1000
        # A handler gets 70% of the lock; the rest is for outputs, the DLQ and the acknowledgement.
        deadline = polled_at + lock_s * HANDLER_SHARE_OF_LOCK
        good = [m for m in messages if not m.error()]
        for m in messages:
            if m.error():
                log.warning("share consumer error: %s", m.error())
        poll = _Poll(len(good))
        calls = [_Call(_record(m), poll, deadline) for m in good]
        self.runtime.pool.submit(calls)
        self._await(poll, calls, deadline)
        acknowledge = self.consumer.acknowledge
        for message, call in zip(good, calls, strict=True):
            outcome, ack = self._decide(call)
            acknowledge(message, ack)
            outcomes.append(outcome)
        self.pending = True
        if time.monotonic() - polled_at > lock_s / 2:
            self.pending = not self._commit()

    def _await(self, poll: _Poll, calls: list[_Call], deadline: float) -> None:
        """Wait until every call settled; at the deadline give up on the unfinished (RELEASE or DLQ).

        Calls already producing outputs get DELIVERY_TIMEOUT_S more: their outputs are on the
        way and must not be duplicated by a redelivery if they can still land.
        """
        with poll.cond:
            if poll.cond.wait_for(lambda: poll.unsettled == 0, max(0.0, deadline - time.monotonic())):
                return
            timeout = Failure("Timeout", f"handler ran past its deadline of {deadline - calls[0].started:.1f}s")
            for call in calls:
                if call.state in (_Call.QUEUED, _Call.RUNNING):
                    if call.state == _Call.RUNNING:
                        self.runtime.pool.replace_stuck()
                    poll.settle(call, _Call.ABANDONED, (RELEASED, timeout))
            if poll.cond.wait_for(lambda: poll.unsettled == 0, DELIVERY_TIMEOUT_S):
                return
            late = (RELEASED, Failure("OutputTimeout", "outputs not delivered in time"))
            for call in calls:  # outputs still not delivered: another delivery may duplicate them, never lose
                poll.settle(call, _Call.ABANDONED, late)

    def _decide(self, call: _Call) -> tuple[Outcome, int]:
        """The acknowledgement for a settled call; the last allowed delivery never ends RELEASEd,
        because the broker would archive it: it goes to the DLQ instead."""
        record = call.record
        outcome, failure = call.result or (RELEASED, Failure("Unknown", "no result"))
        if outcome == RELEASED and record.delivery_count >= self.runtime.settings.delivery_limit:
            outcome = DEAD_LETTERED
        if outcome == ACCEPTED:
            return _outcome(call, ACCEPTED, None), AcknowledgeType.ACCEPT
        now_ms = int(time.time() * 1000)
        first = self.runtime.first_attempt(record, int(call.started_wall * 1000) or now_ms)
        if outcome == DEAD_LETTERED:
            dead = dead_letter_record(
                record,
                self.runtime.settings.dlq_topic,
                record.delivery_count,
                failure or Failure("Unknown", ""),
                first,
                now_ms,
            )
            try:
                self.runtime.produce_and_wait([dead])
            except Exception as exc:
                # Never REJECT what the DLQ did not take: release it, the broker delivers it again.
                log.error("DLQ write failed for %s-%d@%d: %s", record.topic, record.partition, record.offset, exc)
                return _outcome(call, RELEASED, Failure("DeadLetterWriteFailed", str(exc))), AcknowledgeType.RELEASE
            return _outcome(call, DEAD_LETTERED, failure), AcknowledgeType.REJECT
        return _outcome(call, RELEASED, failure), AcknowledgeType.RELEASE

    def _commit(self) -> bool:
        try:
            results = self.consumer.commit_sync()
            failed = {tp: err for tp, err in (results or {}).items() if err is not None}
            if failed:
                log.warning("acknowledgements not recorded for %s", failed)
            return not failed
        except KafkaException as exc:
            # The broker redelivers what it did not record; outcomes stay as the handler decided.
            log.warning("acknowledgement commit failed: %s", exc)
            return False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._thread.join(self.runtime.settings.lock_ms / 1000 + DELIVERY_TIMEOUT_S)
            with contextlib.suppress(Exception):
                self.consumer.close()


def _record(message: Message) -> Record:
    return Record.make(
        message.key(),
        message.value(),
        tuple(message.headers() or ()),
        message.topic(),
        message.partition(),
        message.offset(),
        message.delivery_count() or 1,
        message.timestamp()[1],
    )


def _outcome(call: _Call, outcome: str, failure: Failure | None) -> Outcome:
    return Outcome.of(call.record, outcome, failure, (time.monotonic() - call.started) * 1000, call.inflight)


# Share consumers leave the group cleanly when Spark stops the worker process.
RUNTIMES: PerProcess[ProcessRuntime] = PerProcess(lambda text: ProcessRuntime(ShareSettings.from_json(text)))
