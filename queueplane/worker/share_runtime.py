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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from confluent_kafka import AcknowledgeType, KafkaException, Message, ShareConsumer

from queueplane.dlq import Failure
from queueplane.handler import Handler, MessageRecord, Output, Record, Reject, load_handler, outputs_of
from queueplane.worker.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    DELIVERY_TIMEOUT_S,
    RELEASED,
    Outcome,
    OutcomeColumns,
    ProducedRecord,
    accepted_columns,
    columns_of,
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
# A pool thread takes a poll's calls in chunks of about this much handler time: a quick handler's
# calls go to one thread together instead of waking a thread per record (each hand-over cost more
# than a trivial call), while calls of 2 ms or more still go one to a thread.
CHUNK_S = 0.002
# A chunk whose running call has taken this long hands its calls not yet started to other threads,
# so one slow or hung record holds up no other record for longer than this.
STUCK_S = 0.05
# A micro-batch's time slice. Each batch costs Spark a fixed amount of driver and executor work
# (planning, the task round trip, the sink): on an idle queue, 0.13 s of JVM CPU a second at
# 1 s slices against 0.04 s at 3 s, and a trivial handler's busy run spent 4-5 us of JVM per record
# at 1 s against 2-3 us at 3 s. Acknowledgements do not wait for it; only the outcome rows do.
SLICE_MS = 3000
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
    batch_ms: int = SLICE_MS


# A call's verdict: its outcome, its failure, and when its handler started (monotonic; 0.0 when it
# never did, and then the poll's time stands in for it in the DLQ headers).
Result = tuple[str, Failure | None, float]
_ACCEPTED_RESULT: Result = (ACCEPTED, None, 0.0)


class _Poll:
    """The records of one poll, their results and their deadline: the fetcher waits on one
    condition for all of them.

    Results and in-flight counts are lists indexed like the records, not an object per call:
    a trivial handler's record cost more in that object than in the handler. Pool threads
    write a result without the lock and report finished calls once per chunk; only the moves
    that must not cross the fetcher giving up on the poll take the condition: a call starting
    to produce outputs, and the end of that.
    """

    __slots__ = ("abandoned", "cond", "deadline", "inflight", "records", "results", "unsettled")

    def __init__(self, records: list[MessageRecord], deadline: float):
        self.cond = threading.Condition(threading.Lock())
        self.records = records
        self.results: list[Result | None] = [None] * len(records)  # None until the call ends
        self.inflight = [0] * len(records)  # calls running in the pool when each call started
        self.unsettled = len(records)
        self.deadline = deadline
        self.abandoned = False  # the deadline passed: results written from now on are not waited for

    def finished(self, count: int) -> None:
        with self.cond:
            self.unsettled -= count
            if self.unsettled <= 0:
                self.cond.notify_all()


class _Chunk:
    """Calls of one poll, as indices into its records, that one pool thread runs in turn.

    ``todo`` is an iterator because taking its next index is one step under the interpreter
    lock: the thread and a fetcher splitting the chunk off a stuck call both take indices from
    it, and each is taken exactly once. ``since`` is when the thread started the call it is in,
    0 while no call of it runs; ``producing`` is the index of the call whose outputs are on
    their way (set under the poll's condition), -1 while none is.
    """

    __slots__ = ("poll", "producing", "since", "todo")

    def __init__(self, poll: _Poll, indices: Sequence[int]):
        self.poll = poll
        self.todo: Iterator[int] = iter(indices)
        self.since = 0.0
        self.producing = -1


class HandlerPool:
    """``size`` daemon threads running handler calls for every fetcher of the process.

    Threads take chunks: as many calls of one poll as make about CHUNK_S of handler time, by
    the running mean of the calls so far (one call a chunk until there is one). A call stuck
    past its deadline keeps its thread (a Python thread cannot be stopped); the pool starts a
    replacement so the number of usable threads stays ``size``.
    """

    def __init__(self, runtime: ProcessRuntime, size: int):
        self.runtime = runtime
        self.size = size
        self.chunks: queue.SimpleQueue[_Chunk] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # notified when queued chunks fall below ROOM_ROUNDS rounds
        self.live = 0
        self.inflight = 0  # threads inside a chunk, so calls running at once
        self.queued = 0  # chunks handed in and not yet taken by a thread
        self.mean_call_s = CHUNK_S  # running mean of handler calls; unknown counts as slow
        for _ in range(size):
            self._spawn()

    def chunk_size(self, calls: int) -> int:
        return max(1, min(calls, int(CHUNK_S / max(self.mean_call_s, 1e-7))))

    def submit(self, poll: _Poll, indices: Sequence[int], size: int = 1) -> list[_Chunk]:
        """Hand the calls of ``indices`` to the threads in chunks of ``size``; the chunks, for the
        fetcher's stuck check and deadline."""
        chunks = [_Chunk(poll, indices[i : i + size]) for i in range(0, len(indices), size)]
        with self.lock:
            self.queued += len(chunks)
        put = self.chunks.put
        for chunk in chunks:
            put(chunk)
        return chunks

    def split_stuck(self, chunks: list[_Chunk]) -> list[_Chunk]:
        """Calls waiting behind a call that has run STUCK_S go to other threads, one a chunk;
        the new chunks."""
        now = time.monotonic()
        split: list[_Chunk] = []
        for chunk in chunks:
            if chunk.since and now - chunk.since >= STUCK_S:
                waiting = list(chunk.todo)  # one step: the chunk's thread takes none of these after it
                if waiting:
                    split += self.submit(chunk.poll, waiting)
        return split

    def wait_for_room(self, timeout: float) -> bool:
        """Whether fewer chunks wait than ROOM_ROUNDS rounds of the threads (waiting up to ``timeout``).

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
            chunk = self.chunks.get()
            with self.lock:
                self.queued -= 1
                if self.queued == ROOM_ROUNDS * self.size - 1:
                    self.room.notify_all()
                self.inflight += 1
            try:
                self._run(chunk)
            except Exception:  # handler errors are results; anything else must not cost the pool a thread
                log.exception("a handler thread failed a chunk; continuing")
            with self.lock:
                self.inflight -= 1
                if self.live > self.size:  # a replacement took this thread's place while it was stuck
                    self.live -= 1
                    return

    def _run(self, chunk: _Chunk) -> None:
        """Run the chunk's calls until its iterator is exhausted; report how many ended, once.

        The handler call is inline, with its verdicts, because it is the loop of the hot path.
        """
        poll = chunk.poll
        records, results, inflight, deadline = poll.records, poll.results, poll.inflight, poll.deadline
        handler, monotonic = self.runtime.handler, time.monotonic
        ended = ran = 0
        began = monotonic()
        try:
            for i in chunk.todo:
                now = chunk.since = monotonic()
                ended += 1
                if now >= deadline:
                    results[i] = (RELEASED, Failure("Timeout", "the lock ran out before the handler started"), 0.0)
                    continue
                inflight[i] = self.inflight
                ran += 1
                try:
                    returned = handler(records[i])
                    if returned is not None:
                        outputs = outputs_of(returned)
                        if outputs:
                            self._produce(chunk, i, outputs, now)  # sets the result itself, under the lock
                            continue
                except Reject as exc:
                    results[i] = (DEAD_LETTERED, Failure.of(exc), now)
                    continue
                except Exception as exc:  # Retry and any other exception: another delivery, unless this was the last
                    results[i] = (RELEASED, Failure.of(exc), now)
                    continue
                results[i] = _ACCEPTED_RESULT
        finally:
            chunk.since = 0.0
            poll.finished(ended)
            if ran:  # once a chunk, from the mean of its calls: a trivial call cost less than the update
                self.mean_call_s += 0.1 * ((monotonic() - began) / ran - self.mean_call_s)

    def _produce(self, chunk: _Chunk, index: int, outputs: list[Output], started: float) -> None:
        """Make call ``index``'s outputs durable and set its result, unless the fetcher gave up on
        the poll. The result is set under the poll's condition: the fetcher waits there for a
        call producing past the deadline, and must see its result before it leaves it."""
        poll = chunk.poll
        with poll.cond:
            if poll.abandoned:  # released already: its outputs must not appear
                poll.results[index] = (RELEASED, Failure("Timeout", "the handler returned after its deadline"), started)
                return
            chunk.producing = index
        result: Result
        try:
            record = poll.records[index]
            self.runtime.produce_and_wait([self.runtime.output_record(o, record) for o in outputs])
            result = _ACCEPTED_RESULT
        except Exception as exc:
            result = (RELEASED, Failure.of(exc), started)
        with poll.cond:
            poll.results[index], chunk.producing = result, -1
            poll.cond.notify_all()


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
        self._outbox: list[OutcomeColumns] = []
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

    def run_batch(self, final: bool = False) -> list[OutcomeColumns]:
        """Renew the lease for one time slice and return the outcomes the fetchers settled meanwhile.

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

    def leave_cycle(self, fetcher: ShareFetcher, outcomes: list[OutcomeColumns]) -> None:
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
            outcomes: list[OutcomeColumns] = []
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

    def _cycle(self, outcomes: list[OutcomeColumns]) -> None:
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
        polled_at = time.monotonic()
        good = [m for m in messages if not m.error()]
        if len(good) < len(messages):
            for m in messages:
                if m.error():
                    log.warning("share consumer error: %s", m.error())
        if not good:
            return
        lock_s = self.runtime.settings.lock_ms / 1000
        # A handler gets 70% of the lock; the rest is for outputs, the DLQ and the acknowledgement.
        poll = _Poll(MessageRecord.many(good), polled_at + lock_s * HANDLER_SHARE_OF_LOCK)
        pool = self.runtime.pool
        chunks = pool.submit(poll, range(len(good)), pool.chunk_size(len(good)))
        self._await(poll, chunks)
        self._acknowledge(good, poll, polled_at, outcomes)
        self.pending = True
        if time.monotonic() - polled_at > lock_s / 2:
            self.pending = not self._commit()

    def _acknowledge(
        self, messages: list[Message], poll: _Poll, polled_at: float, outcomes: list[OutcomeColumns]
    ) -> None:
        """Acknowledge each record of a poll and add its outcomes; latency runs from the poll.

        A poll whose every record was accepted without outputs is the common case: its
        columns are built straight from the messages, one pass each, with no row per record.
        """
        acknowledge, results = self.consumer.acknowledge, poll.results
        latency_ms = (time.monotonic() - polled_at) * 1000
        if results.count(_ACCEPTED_RESULT) == len(messages):
            accept = AcknowledgeType.ACCEPT
            for message in messages:
                acknowledge(message, accept)
            outcomes.append(accepted_columns(messages, latency_ms, poll.inflight))
            return
        rows = []
        for message, record, result, inflight in zip(messages, poll.records, results, poll.inflight, strict=True):
            outcome, ack = self._decide(record, result, inflight, polled_at, latency_ms)
            acknowledge(message, ack)
            rows.append(outcome)
        outcomes.append(columns_of(rows))

    def _await(self, poll: _Poll, chunks: list[_Chunk]) -> None:
        """Wait until every call ended; at the deadline give up on the unfinished (RELEASE or DLQ).

        Every STUCK_S it looks for chunks whose call runs that long and hands their calls not
        yet started to other threads. Calls already producing outputs get DELIVERY_TIMEOUT_S
        more at the deadline: their outputs are on the way and must not be duplicated by a
        redelivery if they can still land.
        """
        pool, results = self.runtime.pool, poll.results
        with poll.cond:
            while True:
                left = poll.deadline - time.monotonic()
                if poll.cond.wait_for(lambda: poll.unsettled <= 0, max(0.0, min(left, STUCK_S))):
                    return
                if left <= STUCK_S:
                    break
                chunks += pool.split_stuck(chunks)
            poll.abandoned = True
            producing = [chunk.producing for chunk in chunks if chunk.producing >= 0]
            for chunk in chunks:
                if chunk.since and chunk.producing < 0:
                    pool.replace_stuck()  # its thread is inside a call past the deadline
            timeout: Result = (RELEASED, Failure("Timeout", "the handler ran past its deadline"), 0.0)
            for i, result in enumerate(results):
                if result is None and i not in producing:
                    results[i] = timeout
            if poll.cond.wait_for(lambda: all(results[i] is not None for i in producing), DELIVERY_TIMEOUT_S):
                return
            late: Result = (RELEASED, Failure("OutputTimeout", "outputs not delivered in time"), 0.0)
            for i in producing:  # outputs still not delivered: another delivery may duplicate them, never lose
                if results[i] is None:
                    results[i] = late

    def _decide(
        self, record: Record, result: Result | None, inflight: int, polled_at: float, latency_ms: float
    ) -> tuple[Outcome, int]:
        """The acknowledgement for an ended call; the last allowed delivery never ends RELEASEd,
        because the broker would archive it: it goes to the DLQ instead."""
        outcome, failure, ran_at = result or (RELEASED, Failure("Unknown", "no result"), 0.0)
        if outcome == RELEASED and record.delivery_count >= self.runtime.settings.delivery_limit:
            outcome = DEAD_LETTERED
        if outcome == ACCEPTED:
            return Outcome.of(record, ACCEPTED, None, latency_ms, inflight), AcknowledgeType.ACCEPT
        now = time.time()
        started = now - (time.monotonic() - (ran_at or polled_at))  # the handler's start, wall clock
        first = self.runtime.first_attempt(record, int(started * 1000))
        if outcome == DEAD_LETTERED:
            dead = dead_letter_record(
                record,
                self.runtime.settings.dlq_topic,
                record.delivery_count,
                failure or Failure("Unknown", ""),
                first,
                int(now * 1000),
            )
            try:
                self.runtime.produce_and_wait([dead])
            except Exception as exc:
                # Never REJECT what the DLQ did not take: release it, the broker delivers it again.
                log.error("DLQ write failed for %s-%d@%d: %s", record.topic, record.partition, record.offset, exc)
                failed = Failure("DeadLetterWriteFailed", str(exc))
                return Outcome.of(record, RELEASED, failed, latency_ms, inflight), AcknowledgeType.RELEASE
            return Outcome.of(record, DEAD_LETTERED, failure, latency_ms, inflight), AcknowledgeType.REJECT
        return Outcome.of(record, RELEASED, failure, latency_ms, inflight), AcknowledgeType.RELEASE

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


# Share consumers leave the group cleanly when Spark stops the worker process.
RUNTIMES: PerProcess[ProcessRuntime] = PerProcess(lambda text: ProcessRuntime(ShareSettings.from_json(text)))
