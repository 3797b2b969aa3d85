"""A retried kmq task and the tracker: a copy whose process died is the tracker's once its lock ran out."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
from kmq_fakes import DLQ, kmq_process

from queueplane.handler_api import Record
from queueplane.run.executor.crash_journal import CrashJournal, Delivery
from queueplane.run.executor.failed_writes import FailedWrites
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.executor.tasks import TRACKER_MARGIN_MS, KmqTask
from queueplane.run.outcomes import DEAD_LETTERED, DUPLICATE

LOCK_MS = 5_000
LIMIT = 3


def _record(offset: int) -> Record:
    return Record(b"k", b"v", (), "q", 0, offset, 1, 0)


def _died_in(folder, delivery: Delivery) -> CrashJournal:
    """The journal of the process after one that died in a call of ``delivery``."""
    pid = os.fork()
    if pid == 0:
        CrashJournal(folder, alone_s=LOCK_MS / 1000).begin(delivery.partition, delivery.offset, delivery)
        os._exit(1)
    os.waitpid(pid, 0)
    return CrashJournal(folder, alone_s=LOCK_MS / 1000)


def test_a_retry_leaves_to_the_tracker_only_the_copies_whose_crashed_delivery_is_past_its_lock(tmp_path):
    now_ms = int(time.time() * 1000)
    journal = _died_in(tmp_path / "late", Delivery(0, 10, now_ms - LOCK_MS))  # its lock ran out just now
    journal.crashed_deliveries[(0, 11)] = now_ms - LOCK_MS + TRACKER_MARGIN_MS + 500  # 1.5 s to go: ours
    journal.crashed_deliveries[(0, 12)] = now_ms - LOCK_MS + TRACKER_MARGIN_MS - 1  # too close: the tracker's
    process = SimpleNamespace(journal=journal, settings=SimpleNamespace(lock_ms=LOCK_MS), failed_writes=FailedWrites())
    task = KmqTask(process, [_record(offset) for offset in (9, 10, 11, 12)])  # 9 never crashed
    assert task._taken_by_tracker(now_ms) == {1, 3}


def test_a_retry_dead_letters_again_the_copy_that_went_to_the_dlq_and_a_later_copy_is_a_duplicate(tmp_path):
    """The copy at (0, 10) killed its processes and went to the DLQ; then the process that wrote
    it died too, with the row. The task's retry meets (0, 10) again: counted and in the DLQ once
    more. The tracker's copy of the same message at (0, 50) only ends."""
    for _ in range(LIMIT):
        _died_in(tmp_path, Delivery(0, 10, int(time.time() * 1000)))
    process = kmq_process(tmp_path, handler=lambda record: pytest.fail("a dead-lettered message is not called"))
    process.journal.dead_lettered(0, 10, (0, 10))
    original = _record(10)
    where = km.origin((), "q", 0, 10)
    copy = Record(b"k", b"v", tuple(km.redelivery_headers((), where, 2, 1)), "q", 0, 50, 2, 0)
    task = KmqTask(process, [original, copy])
    task.start()
    task.wait()
    rows = {row.offset: row for row in task.drain()}
    assert (rows[10].outcome, rows[10].delivery_count) == (DEAD_LETTERED, LIMIT)
    assert rows[50].outcome == DUPLICATE
    assert [key for _, key, _ in process.producer.to(DLQ)] == [b"k"], "the one DLQ write is the retry's"
