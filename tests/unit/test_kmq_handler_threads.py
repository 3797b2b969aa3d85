"""A kmq task's records go to the process's handler threads through one queue per task: a call
that hangs holds its own thread and record, and the other threads take the rest."""

from __future__ import annotations

import threading
import time

from kmq_fakes import kmq_process

from queueplane.handler_api import Record
from queueplane.run.kmq.executor.tasks import KmqTask
from queueplane.run.outcomes import ACCEPTED


def test_a_hung_call_holds_only_its_record_while_the_other_threads_take_the_rest(tmp_path):
    release = threading.Event()
    called: list[int] = []

    def handler(record: Record) -> None:
        called.append(record.offset)
        if record.offset == 0:
            release.wait(30)

    records = [Record(b"k", b"v", (), "q", 0, offset, 1, 0) for offset in range(50)]
    task = KmqTask(kmq_process(tmp_path, handler, threads=2), records)
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
