"""A share-group worker process (KIP-932): its fetchers and handler pool, kept across tasks.

Each worker process keeps its ShareConsumers across micro-batches, so consumers stay group
members instead of joining and leaving every batch; they leave the group after a draining batch
(a stop or a scale-down), and the next batch that is not a drain starts new ones. The fetchers
run continuously in background threads while the driver holds a lease on them, so Spark's pause
between two micro-batches costs no throughput; a micro-batch task renews the lease, waits one
time slice and takes the outcomes settled meanwhile. Per record: the handler runs under a
deadline shorter than the acquisition lock, outputs and dead-letter records are made durable,
and only then is the record acknowledged (ACCEPT, RELEASE or REJECT) and the acknowledgement
committed. The last micro-batch of a run drains: fetchers handle what their consumers acquired,
leave the group holding nothing unhandled, and report it all, so a stopped worker leaves nothing
acquired and nothing unreported.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict

from queueplane.handler_api import Handler, Output, Record
from queueplane.run.executor.call_guard import CallGuard
from queueplane.run.executor.crash_journal import CrashJournal, journal_folder, process_tag
from queueplane.run.executor.handler import load_handler
from queueplane.run.executor.memory_guard import guard
from queueplane.run.executor.outputs import output_record
from queueplane.run.executor.processes import PerProcess, ServedProducer
from queueplane.run.outcomes import (
    DELIVERY_TIMEOUT_S,
    OutcomeColumns,
    ProducedRecord,
    produce_and_wait,
)
from queueplane.run.share.executor.accepted import AcceptedLately
from queueplane.run.share.executor.fetcher import ShareFetcher
from queueplane.run.share.executor.isolated import IsolatedCalls
from queueplane.run.share.executor.outbox import Outbox, Task, Unrecorded
from queueplane.run.share.executor.pool import HandlerPool
from queueplane.run.share.executor.queue_end import QueueEnd, topic_end_reader
from queueplane.run.share.settings import (
    ACCEPTED_MEMORY_LOCKS,
    ACCEPTED_MEMORY_S,
    FETCHER_SHARE,
    HANDLER_SHARE_OF_LOCK,
    IDLE_AFTER_S,
    IDLE_LEAVE_S,
    LEASE_GRACE_S,
    ShareSettings,
)

log = logging.getLogger("queueplane.worker")


class ShareProcess:
    """One per Python worker process and queue: producer, handler, handler pool and fetchers."""

    def __init__(self, settings: ShareSettings):
        self.settings = settings
        self.handler: Handler = load_handler(settings.handler, settings.search_paths)
        self.delivery = ServedProducer(settings.kafka, linger_ms=1, batch_bytes=settings.batch_bytes)
        self.producer = self.delivery.producer
        folder = journal_folder(settings.group_id)
        # A call running past its deadline was given up before the process died: not blamed.
        self.journal = CrashJournal(folder, settings.lock_ms / 1000 * HANDLER_SHARE_OF_LOCK)
        self.memory_guard = guard(settings.memory_limit_mi, self.journal.ending)
        self.calls = CallGuard(self.journal.disown)
        self.isolated = IsolatedCalls(
            settings.handler,
            settings.search_paths,
            settings.output_topic,
            settings.memory_limit_mi,
            (settings.setup, settings.teardown),
        )
        self.outbox = Outbox(folder)
        self.accepted = AcceptedLately(max(ACCEPTED_MEMORY_S, ACCEPTED_MEMORY_LOCKS * settings.lock_ms / 1000))
        self.pool = HandlerPool(self, settings.slots)
        self.fetchers: list[ShareFetcher] = []
        # When a record's first failed delivery started in this process, for the DLQ headers (bounded).
        self.first_attempts: OrderedDict[tuple[str, int, int], int] = OrderedDict()
        self._first_lock = threading.Lock()
        self._batch_lock = threading.Lock()
        # The lease: fetchers acquire records only before ``_lease_until`` (monotonic seconds).
        self._lease = threading.Condition()
        self._lease_until = 0.0
        self._last_outcome = time.monotonic()  # when a batch last returned outcomes (or the process started)
        self._batches_by_hand = itertools.count(1)  # the batches of a process driven without Spark
        # When a poll of any of its consumers last brought records (monotonic): a draining consumer
        # whose own polls come back empty stays while its siblings' do not (fetcher.py, _may_leave).
        self.records_polled_at = 0.0
        # When the queue's topic last grew (read by draining consumers with a fetch out).
        self.queue_end = QueueEnd(topic_end_reader(settings.kafka, settings.topic))

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

    def run_batch(self, final: bool = False, task: Task | None = None) -> list[OutcomeColumns]:
        """Renew the lease for one time slice and return the outcomes the fetchers settled meanwhile.

        ``final`` drains instead: the lease ends now, every fetcher settles and commits what it
        holds, and the task returns all of it, so the driver can stop with nothing in flight.

        ``task`` is the micro-batch's task (source.py): the outcomes stay in the outbox's file,
        handed to it, until this process's next task starts (outbox.py), so a process that dies
        before Spark has them leaves them to the task's retry. Called without one (a process
        driven by hand), each call is a batch of a stream of this process's own.
        """
        if task is None:
            task = (process_tag(), next(self._batches_by_hand), 0)
        with self._batch_lock:  # two tasks in one process never share fetchers
            self.outbox.begin(task)
            # At least two: one polls while the other waits for the tail of its poll. None join
            # for a drain: a consumer that joined and left at once had its first fetch acquire
            # records it never handed out, which came back one delivery higher (measured).
            self.fetchers = [f for f in self.fetchers if not f.left]  # those that left while idle
            wanted = 0 if final else max(2, -(-self.settings.slots // FETCHER_SHARE))
            while len(self.fetchers) < wanted:
                self.fetchers.append(ShareFetcher(self, len(self.fetchers)))
            slice_s = self.settings.batch_ms / 1000
            if final:
                with self._lease:
                    self._lease_until = 0.0
                    for fetcher in self.fetchers:
                        fetcher.drain()
                    self._lease.notify_all()
                    limit = time.monotonic() + self.settings.lock_ms / 1000 + DELIVERY_TIMEOUT_S
                    self._lease.wait_for(lambda: all(f.left for f in self.fetchers), limit - time.monotonic())
                self._close_fetchers()
            else:
                self._wait_for_outcomes(slice_s)
            return self.outbox.take()

    def _wait_for_outcomes(self, slice_s: float) -> None:
        """Hold the lease one time slice; in a process idle for a while, on past it until an outcome
        comes or the idle slice ends.

        Every micro-batch costs Spark the same driver and executor work however few records it
        carries, and an idle queue would pay it every slice. A busy process settles outcomes
        within each slice, so its batches keep the short slice; an idle one runs a batch per
        idle slice, and returns as soon as a record it was waiting for settles.
        """
        started = time.monotonic()
        idle = started - self._last_outcome >= IDLE_AFTER_S
        until = started + (max(slice_s, self.settings.idle_batch_ms / 1000) if idle else slice_s)
        with self._lease:
            self._lease_until = until + LEASE_GRACE_S
            self._lease.notify_all()
        time.sleep(slice_s)
        if idle:
            with self._lease:
                self._lease.wait_for(self.outbox.holds, until - time.monotonic())
                self._lease_until = time.monotonic() + LEASE_GRACE_S
        if self.outbox.holds():
            self._last_outcome = time.monotonic()

    def _close_fetchers(self) -> None:
        """After a drain: every consumer has left the group (or is made to, past the drain's time
        limit), so that a process about to be killed (a scale-down) holds nothing: records a
        consumer acquired and never handed out come back one delivery higher, at a close as at a
        kill (fetcher.py, ``_fetch_out``). The next batch that is not a drain starts new consumers."""
        fetchers, self.fetchers = self.fetchers, []
        for fetcher in fetchers:
            fetcher.stop()
        with self._lease:
            self._lease.notify_all()
        for fetcher in fetchers:
            fetcher.close()

    def leased(self) -> bool:
        return time.monotonic() < self._lease_until

    def unleased_long(self) -> bool:
        """Whether a lease has been over for IDLE_LEAVE_S: no task of a batch came for this process."""
        return 0.0 < self._lease_until < time.monotonic() - IDLE_LEAVE_S

    def enter_cycle(self, fetcher: ShareFetcher) -> bool:
        """Mark the fetcher busy if it may poll (lease held) or must commit (lease ended with
        acknowledgements pending); otherwise wait a little for a renewal and say no."""
        with self._lease:
            if self.leased() or fetcher.pending or fetcher.draining:
                fetcher.busy = True
                return True
            self._lease.wait(0.5)
            return False

    def leave_cycle(self, fetcher: ShareFetcher, outcomes: list[OutcomeColumns]) -> None:
        if outcomes:
            self.outbox.add(outcomes)
            self.accepted.note(outcomes)
        with self._lease:
            fetcher.busy = False
            self._lease.notify_all()

    def settle(self, token: int, unrecorded: Unrecorded) -> None:
        """Outcomes a fetcher put in the outbox provisional, in the middle of its cycle, settled
        by its commit's answer (``Outbox.settle``): those confirmed are for the next batch."""
        self.accepted.note(self.outbox.settle(token, unrecorded))
        with self._lease:
            self._lease.notify_all()

    def close(self) -> None:
        with self._lease:
            self._lease_until = 0.0
            self._lease.notify_all()
        for fetcher in self.fetchers:
            fetcher.close()
        self.delivery.close()
        self.outbox.close()
        self.journal.close()


PROCESSES: PerProcess[ShareProcess] = PerProcess(lambda text: ShareProcess(ShareSettings.from_json(text)))
