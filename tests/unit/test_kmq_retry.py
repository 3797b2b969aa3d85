"""A retried kmq task and the tracker: a copy whose process died is the tracker's once its lock ran out."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from queueplane.run.crash_journal import CrashJournal, Delivery
from queueplane.run.failed_writes import FailedWrites
from queueplane.run.handler import Record
from queueplane.run.kmq.tasks import TRACKER_MARGIN_MS, KmqTask

LOCK_MS = 5_000


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
