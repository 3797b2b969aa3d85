"""The memory guard: a process past its limit ends itself, and the record it was in is blamed with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from queueplane.run.executor.crash_journal import WORKER_DIED, CrashJournal, worker_died
from queueplane.run.executor.memory_guard import (
    EXIT_CODE,
    GROWTH_BYTES_PER_S,
    INTERVAL_S,
    MEMORY_LIMIT_EXCEEDED,
    next_read_s,
    resident_bytes,
)

CHILD = """
import sys, time
from pathlib import Path
from queueplane.run.executor.crash_journal import CrashJournal
from queueplane.run.executor.memory_guard import MemoryGuard, resident_bytes

folder, headroom_mi, allocate_mi = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
journal = CrashJournal(folder, alone_s=5)
MemoryGuard(resident_bytes() + (headroom_mi << 20), journal.ending)
journal.begin(1, 5)
held = []
for _ in range(allocate_mi // 16):
    held.append(b"x" * (16 << 20))  # written, so resident
    time.sleep(0.005)
"""


def _child(folder, headroom_mi: int, allocate_mi: int) -> int:
    """A process with a guard ``headroom_mi`` above its size that allocates ``allocate_mi`` in a
    call of record 1:5; its exit status.

    A new interpreter, not a fork of the test's process: a fork of a pytest-xdist worker (its
    I/O threads, the clients earlier tests left) died of SIGSEGV instead of the guard's exit.
    """
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(headroom_mi), str(allocate_mi)], capture_output=True, timeout=60
    )
    return done.returncode


def test_a_process_past_its_limit_ends_itself_and_says_why(tmp_path):
    assert _child(tmp_path, headroom_mi=64, allocate_mi=1024) == EXIT_CODE
    journal = CrashJournal(tmp_path, alone_s=5)
    assert journal.crashes == {(1, 5): 1}
    reason = journal.reasons[(1, 5)]
    assert reason.error_class == MEMORY_LIMIT_EXCEEDED
    assert "over processing.memoryLimit" in reason.message
    failure = worker_died(3, reason)
    assert failure.error_class == MEMORY_LIMIT_EXCEEDED
    assert failure.message.endswith("died 3 time(s) while handling this record")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".reason")] == [], "read once, then gone"


def test_a_process_within_its_limit_runs_on(tmp_path):
    assert _child(tmp_path, headroom_mi=512, allocate_mi=64) == 0


def test_a_later_death_without_a_reason_is_not_given_the_earlier_one(tmp_path):
    assert _child(tmp_path, headroom_mi=64, allocate_mi=1024) == EXIT_CODE
    CrashJournal(tmp_path, alone_s=5).close()  # counted: 1 crash, MemoryLimitExceeded
    pid = os.fork()
    if pid == 0:
        CrashJournal(tmp_path, alone_s=5).begin(1, 5)
        os._exit(1)
    os.waitpid(pid, 0)
    journal = CrashJournal(tmp_path, alone_s=5)
    assert journal.crashes == {(1, 5): 2}
    assert worker_died(2, journal.reasons.get((1, 5))).error_class == WORKER_DIED


def test_the_guard_reads_less_often_the_further_below_its_limit_a_process_is():
    limit = 1 << 30
    assert next_read_s(limit - (16 << 20), limit) == INTERVAL_S, "near the limit: every interval"
    far = next_read_s(limit - (768 << 20), limit)
    assert far == pytest.approx((768 << 20) / GROWTH_BYTES_PER_S), "until it could have grown to the limit"
    assert INTERVAL_S < far < 1.0
    assert next_read_s(0, 64 << 30) == 1.0, "at least once a second"
    assert next_read_s(limit + 1, limit) == INTERVAL_S


def test_a_kept_open_statm_reads_the_current_size():
    statm = os.open("/proc/self/statm", os.O_RDONLY)
    try:
        before = resident_bytes(statm)
        held = b"x" * (64 << 20)
        assert resident_bytes(statm) - before >= 60 << 20, "each read is new figures, not the first one again"
        assert abs(resident_bytes(statm) - resident_bytes()) < 8 << 20
        del held
    finally:
        os.close(statm)
