"""A kmq task's records go to the process's handler threads through one queue per task: a call
that hangs holds its own thread and record, and the other threads take the rest."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from queueplane.run.crash_journal import CrashJournal
from queueplane.run.failed_writes import FailedWrites
from queueplane.run.handler import Record
from queueplane.run.kmq.tasks import HandlerThreads, KmqTask
from queueplane.run.outcomes import ACCEPTED

LOCK_MS = 30_000


class _Producer:
    def __init__(self):
        self.markers: list[bytes] = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None, partition=None):
        self.markers.append(value.split(b" ")[0] + b" " + key)

    def __len__(self) -> int:
        return 0


def test_a_hung_call_holds_only_its_record_while_the_other_threads_take_the_rest(tmp_path):
    release = threading.Event()
    called: list[int] = []

    def handler(record: Record) -> None:
        called.append(record.offset)
        if record.offset == 0:
            release.wait(30)

    producer = _Producer()
    settings = SimpleNamespace(
        lock_ms=LOCK_MS,
        markers_topic="q.markers",
        dlq_topic="q.dlq",
        output_topic=None,
        delivery_limit=3,
        backoff_ms=100,
        max_backoff_ms=100,
    )
    process = SimpleNamespace(
        settings=settings,
        handler=handler,
        producer=producer,
        delivery=SimpleNamespace(all_delivered=lambda within_s: True),
        threads=HandlerThreads(2),
        journal=CrashJournal(tmp_path / "journal", alone_s=LOCK_MS / 1000),
        failed_writes=FailedWrites(),
    )
    records = [Record(b"k", b"v", (), "q", 0, offset, 1, 0) for offset in range(50)]
    task = KmqTask(process, records)
    rows = []
    task.start()
    try:
        deadline = time.monotonic() + 20
        while len(rows) < 49 and time.monotonic() < deadline:
            rows += task.drain()
            time.sleep(0.01)
        assert {row.offset for row in rows if row.outcome == ACCEPTED} == set(range(1, 50)), (
            "every record but the hung one ended, on the other thread"
        )
        assert sorted(called) == list(range(50)), "each record was called once"
    finally:
        release.set()
    task.wait()
    rows += task.drain()
    assert sorted(row.offset for row in rows if row.outcome == ACCEPTED) == list(range(50))
