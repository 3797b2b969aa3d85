"""A consumer slot's deadline counts its handler's time only, not a wait the crash journal imposes."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from queueplane.handler_api import Record
from queueplane.run.consumer.executor.slots import Slot
from queueplane.run.executor.crash_journal import CrashJournal
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, RELEASED

LOCK_S = 1.0


class _Owner:
    """A partition task reduced to what a slot reports to it."""

    def __init__(self, journal: CrashJournal, handler):
        self.settings = SimpleNamespace(
            lock_ms=LOCK_S * 1000, delivery_limit=3, backoff_ms=1, max_backoff_ms=1, output_topic="out"
        )
        self.process = SimpleNamespace(journal=journal, handler=handler)
        self.rows: list[tuple[int, str, str | None]] = []
        self._lock = threading.Lock()

    def calls_running(self) -> int:
        return 0

    def quick_produce(self, record, outputs, latency_ms, inflight) -> bool:
        return True  # no outputs to write here

    def settled(self, done) -> None:
        for record, _outputs, latency_ms, inflight in done:
            self.report(record, ACCEPTED, None, latency_ms, inflight)

    def report(self, record, outcome, failure, latency_ms, inflight) -> None:
        with self._lock:
            self.rows.append((record.offset, outcome, failure and failure.error_class))

    def settle(self, record, outcome, failure, produced, latency_ms, inflight) -> None:
        self.report(record, outcome, failure, latency_ms, inflight)

    def dead_letter(self, record, failure, first_ms, latency_ms, inflight) -> None:
        self.report(record, DEAD_LETTERED, failure, latency_ms, inflight)

    def fail(self, exc: BaseException) -> None:
        raise AssertionError(f"the slot failed its task: {exc!r}")


def _record(offset: int) -> Record:
    return Record(None, b"v", (), "in", 0, offset, 1, 0)


def _watch_until_finished(slots: list[Slot], owner: _Owner, within_s: float) -> None:
    """The task's watchdog over the slots, as PartitionTask runs it, until every slot has finished."""
    deadline = time.monotonic() + within_s
    while not all(slot.finished.is_set() for slot in slots):
        assert time.monotonic() < deadline, owner.rows
        now = time.monotonic()
        for slot in slots:
            slot.watch(now)
        time.sleep(0.01)


def test_a_suspect_waiting_to_run_alone_is_not_timed_out_by_the_wait(tmp_path):
    """An ordinary call runs; a suspect waits for it, then runs alone; a second suspect waits for
    both. Every call ends within the deadline, while the second suspect's wait and call together
    pass it: only the call counts."""
    journal = CrashJournal(tmp_path, alone_s=LOCK_S)
    journal.crashes = {(0, 2): 1, (0, 3): 1}  # each killed a process once
    took = {1: 0.6 * LOCK_S, 2: 0.6 * LOCK_S, 3: 0.3 * LOCK_S}

    def handler(record: Record) -> None:
        time.sleep(took[record.offset])

    owner = _Owner(journal, handler)
    slots = [Slot(owner, index) for index in range(3)]
    for slot, offset in zip(slots, took, strict=True):
        slot.queue.put([_record(offset)])
        slot.queue.put(None)
        time.sleep(0.05 * LOCK_S)  # in this order
    _watch_until_finished(slots, owner, 10 * LOCK_S)
    assert sorted(owner.rows) == [(1, ACCEPTED, None), (2, ACCEPTED, None), (3, ACCEPTED, None)]


def test_records_accepted_before_a_call_that_hangs_are_settled_when_it_is_given_up(tmp_path):
    """The quick path settles accepted records in runs; a hung call must not hold back the ones
    accepted before it in its run, since its thread may never come back. The hung record is the
    chunk's last: the thread that takes over retries it and finds nothing more to run."""
    journal = CrashJournal(tmp_path, alone_s=LOCK_S)
    release = threading.Event()

    def handler(record: Record) -> None:
        if record.offset == 4 and record.delivery_count == 1:
            release.wait(30)  # hangs past its deadline, long after the test has looked

    owner = _Owner(journal, handler)
    slot = Slot(owner, 0)
    slot.queue.put([_record(offset) for offset in range(5)])
    slot.queue.put(None)
    _watch_until_finished([slot], owner, 5)
    release.set()
    assert sorted(owner.rows) == [
        (0, ACCEPTED, None),
        (1, ACCEPTED, None),
        (2, ACCEPTED, None),
        (3, ACCEPTED, None),
        (4, ACCEPTED, None),
        (4, RELEASED, "Timeout"),
    ]


def test_a_slow_handlers_accepted_records_are_settled_while_the_slot_works_on(tmp_path):
    """Runs of accepted records end by time as well as by count: records of a slow handler reach
    the task (and its next commit) while later records of the chunk still run."""
    journal = CrashJournal(tmp_path, alone_s=LOCK_S)
    owner = _Owner(journal, None)
    settled_when_called: dict[int, int] = {}

    def handler(record: Record) -> None:
        settled_when_called[record.offset] = len(owner.rows)
        time.sleep(0.03)

    owner.process.handler = handler
    slot = Slot(owner, 0)
    slot.queue.put([_record(offset) for offset in range(8)])
    slot.queue.put(None)
    assert slot.finished.wait(10)
    assert settled_when_called[7] >= 4, settled_when_called  # runs of two or three 30 ms records
    assert sorted(owner.rows) == [(offset, ACCEPTED, None) for offset in range(8)]


def test_a_call_past_its_deadline_is_still_given_up(tmp_path):
    """The other side of the same clock: a handler that hangs is timed out and retried."""
    journal = CrashJournal(tmp_path, alone_s=LOCK_S)
    hung = threading.Event()

    def handler(record: Record) -> None:
        if not hung.is_set():
            hung.set()
            time.sleep(2 * LOCK_S)

    owner = _Owner(journal, handler)
    slot = Slot(owner, 0)
    slot.queue.put([_record(7)])
    slot.queue.put(None)
    _watch_until_finished([slot], owner, 5)
    assert owner.rows == [(7, RELEASED, "Timeout"), (7, ACCEPTED, None)]
