"""A key slot of the consumer-group runtime: one thread handling its records in order, retrying in place."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from queueplane.handler_api import Record, Reject, outputs_of
from queueplane.run.consumer.executor.process import ConsumerSettings, WorkerProcess
from queueplane.run.dead_letters import Failure
from queueplane.run.executor.crash_journal import PlainCalls, worker_died
from queueplane.run.executor.outputs import output_record
from queueplane.run.executor.retry import retry_delay_ms
from queueplane.run.outcomes import (
    ACCEPTED,
    RELEASED,
    SETTLE_EVERY,
    SETTLE_WITHIN_S,
    ProducedRecord,
)

log = logging.getLogger("queueplane.worker")


# A slot's quick path: outputs handed to the producer by the slot itself; False where it cannot.
QuickProduce = Callable[[Record, list[ProducedRecord], float, int], bool]


class SlotOwner(Protocol):
    """What a slot needs of its partition's task: settings, the handler, and where results go."""

    settings: ConsumerSettings
    process: WorkerProcess

    def calls_running(self) -> int: ...

    def report(
        self, record: Record, outcome: str, failure: Failure | None, latency_ms: float, inflight: int
    ) -> None: ...

    def settle(
        self,
        record: Record,
        outcome: str,
        failure: Failure | None,
        produced: list[ProducedRecord],
        latency_ms: float,
        inflight: int,
    ) -> None: ...

    quick_produce: QuickProduce | None

    def settled(self, done: list[Done]) -> None: ...

    def dead_letter(
        self, record: Record, failure: Failure, first_ms: int, latency_ms: float, inflight: int
    ) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


# A record accepted on the quick path whose outputs the producer has: its latency and inflight.
Done = tuple[Record, list[ProducedRecord], float, int]


@dataclass(slots=True)
class Call:
    record: Record
    attempt: int
    first_ms: int
    # When its handler started: inf while the journal holds it back behind a suspect (or holds a
    # suspect back until it runs alone), a wait that is not the handler's and has no deadline.
    started: float = math.inf


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

    def __init__(self, task: SlotOwner, index: int):
        self.task = task
        self.index = index
        self.queue: queue.Queue[list[Record] | None] = queue.Queue(maxsize=self.DEPTH)
        self.backlog: deque[Record] = deque()
        self.lock = threading.Lock()
        self.generation = 0
        self.current: Call | None = None
        # Accepted on the quick path, not yet settled with the task: settled in runs, or by the
        # watchdog when it gives up the call after them (their thread may never come back).
        self.done: list[Done] = []
        self.finished = threading.Event()
        self._start(None)

    def _start(self, resume: tuple[Record, int, int, float] | None) -> None:
        gen = self.generation
        threading.Thread(target=self._loop, args=(gen, resume), name=f"qp-slot-{self.index}", daemon=True).start()

    def _loop(self, gen: int, resume: tuple[Record, int, int, float] | None) -> None:
        try:
            calls = self.task.process.journal.plain_calls()  # this thread's own journal slot
            if resume is not None and not self._handle(gen, calls, *resume):
                return
            backlog = self.backlog
            while True:
                if not backlog:
                    chunk = self.queue.get()
                    if chunk is None:
                        self.finished.set()
                        return
                    backlog.extend(chunk)
                if not self._run(gen, calls, backlog):
                    return
        except BaseException as exc:  # a bug here must fail the task, not hang it
            self.task.fail(exc)
            self.finished.set()

    def _run(self, gen: int, calls: PlainCalls, backlog: deque[Record]) -> bool:
        """The backlog's records through their first attempts, on the quick path while they return.

        A trivial handler's call cost less than the bookkeeping around it, so a first attempt of
        a record no process died with does what a plain loop does and little more: the journal
        slot, the deadline, the call, its outputs to the producer. Its row and its offset's
        completion wait in ``done`` and go to the task in runs (``SETTLE_EVERY``,
        ``SETTLE_WITHIN_S``), once per run instead of once per record. A record that fails, or
        that the journal must run alone, goes on in ``_handle``. False when the watchdog took
        this thread's place.
        """
        task, lock = self.task, self.lock
        handler, running, output_topic = task.process.handler, task.calls_running, task.settings.output_topic
        quick_produce = task.quick_produce
        enter, leave = calls
        clock, wall = time.monotonic, time.time
        run_began = 0.0  # when the first record of the run in ``done`` was accepted
        while backlog:
            record = backlog.popleft()
            first_ms = int(wall() * 1000)
            if record.delivery_count != 1 or not enter(record.partition, record.offset):
                self._settle_done()
                if not self._handle(gen, calls, record, 1, first_ms, 0.0):
                    return False
                continue
            started = clock()
            self.current = Call(record, 1, first_ms, started)  # unlocked: see _handle
            inflight = running()
            failure: BaseException | None = None
            try:
                outputs = [output_record(o, record, output_topic) for o in outputs_of(handler(record))]
            except BaseException as exc:  # Reject ends it; anything else is tried again, in _handle
                failure = exc
            leave()
            with lock:
                if gen != self.generation:
                    return False  # the deadline passed; the watchdog already counted this attempt
                self.current = None
            ended = clock()
            latency_ms = (ended - started) * 1000
            if failure is None:
                if quick_produce is None:  # exactlyOnce: its outputs wait for the next transaction
                    task.settle(record, ACCEPTED, None, outputs, latency_ms, inflight)
                elif quick_produce(record, outputs, latency_ms, inflight):
                    done = self.done
                    if not done:
                        run_began = ended
                    done.append((record, outputs, latency_ms, inflight))
                    if len(done) >= SETTLE_EVERY or ended - run_began >= SETTLE_WITHIN_S:
                        self._settle_done()
                continue
            self._settle_done()
            wait_ms = self._failed(record, 1, first_ms, failure, latency_ms, inflight)
            if wait_ms is not None and not self._handle(gen, calls, record, 2, first_ms, wait_ms):
                return False
        self._settle_done()
        return True

    def _settle_done(self) -> None:
        """Hand the quick path's accepted records to the task. Only this thread adds to ``done``,
        and only between calls; the watchdog takes it only while a call runs, under the lock."""
        if self.done:
            done, self.done = self.done, []
            self.task.settled(done)

    def _handle(self, gen: int, calls: PlainCalls, record: Record, attempt: int, first_ms: int, wait_ms: float) -> bool:
        """Attempts of one record until it ends; False when the watchdog took this thread's place."""
        s = self.task.settings
        journal = self.task.process.journal
        enter, leave = calls
        crashes = journal.crashes.get((record.partition, record.offset), 0)
        if crashes >= attempt:  # calls in processes that died with them count as deliveries
            if crashes >= s.delivery_limit:
                # Its count stays: a retry of this task (another record killed the process after
                # this one was dead-lettered) dead-letters it again instead of calling it anew.
                died = worker_died(crashes, journal.reasons.get((record.partition, record.offset)))
                self.task.dead_letter(replace(record, delivery_count=crashes), died, first_ms, 0.0, 0)
                return True
            attempt = crashes + 1
        while True:
            if wait_ms:
                time.sleep(wait_ms / 1000)
            delivery = record if record.delivery_count == attempt else replace(record, delivery_count=attempt)
            started = time.monotonic()
            plain = enter(record.partition, record.offset)
            # No lock: only a call can be given up, so no other thread writes ``current`` while it is
            # None, and this thread cannot have been replaced (it checks after each call). A
            # suspect's deadline counts once it may start (``_clock_starts``).
            self.current = Call(delivery, attempt, first_ms, started if plain else math.inf)
            inflight = self.task.calls_running()
            failure: BaseException | None = None
            outputs: list[ProducedRecord] = []
            try:
                if plain:
                    try:
                        result = self.task.process.handler(delivery)
                    finally:
                        leave()
                else:
                    result = journal.call(
                        record.partition, record.offset, self.task.process.handler, delivery, self._clock_starts
                    )
                outputs = [output_record(o, delivery, s.output_topic) for o in outputs_of(result)]
            except BaseException as exc:
                failure = exc
            with self.lock:
                if gen != self.generation:
                    return False  # the deadline passed; the watchdog already counted this attempt
                self.current = None
            latency_ms = (time.monotonic() - started) * 1000
            if failure is None:
                self.task.settle(delivery, ACCEPTED, None, outputs, latency_ms, inflight)
                return True
            wait = self._failed(delivery, attempt, first_ms, failure, latency_ms, inflight)
            if wait is None:
                return True
            attempt, wait_ms = attempt + 1, wait

    def _failed(
        self, delivery: Record, attempt: int, first_ms: int, exc: BaseException, latency_ms: float, inflight: int
    ) -> float | None:
        """An attempt that raised: a Reject (or the last attempt) ends in the DLQ, None; any other
        exception (Retry, a bug, sys.exit()) is reported and the wait before the next attempt returned."""
        s = self.task.settings
        failure = Failure.of(exc)
        if isinstance(exc, Reject) or attempt >= s.delivery_limit:
            self.task.dead_letter(delivery, failure, first_ms, latency_ms, inflight)
            return None
        self.task.report(delivery, RELEASED, failure, latency_ms, inflight)
        return retry_delay_ms(attempt, s.backoff_ms, s.max_backoff_ms)

    def _clock_starts(self) -> None:
        """The handler starts now: its deadline counts from here. No lock: a Call the watchdog
        already dropped is no longer read, and this is one attribute write on the hot path."""
        call = self.current
        if call is not None:
            call.started = time.monotonic()

    def watch(self, now: float) -> None:
        """Give up on a call past its deadline: count the attempt failed and go on in a new thread."""
        s = self.task.settings
        with self.lock:
            call = self.current
            if call is None or now - call.started < s.lock_ms / 1000:
                return
            self.generation += 1
            self.current = None
            done, self.done = self.done, []
        if done:
            self.task.settled(done)  # accepted before the call that hangs: their thread may never return
        failure = Failure("Timeout", f"handler ran past its deadline of {s.lock_ms / 1000:g}s")
        latency_ms = (now - call.started) * 1000
        if call.attempt >= s.delivery_limit:
            self.task.dead_letter(call.record, failure, call.first_ms, latency_ms, 0)
            self._start(None)
            return
        self.task.report(call.record, RELEASED, failure, latency_ms, 0)
        delay = retry_delay_ms(call.attempt, s.backoff_ms, s.max_backoff_ms)
        self._start((call.record, call.attempt + 1, call.first_ms, delay))
