"""A share record on a reserve delivery: which error it takes to the DLQ."""

from __future__ import annotations

from queueplane.run import dead_letters as dlq
from queueplane.run.dead_letters import Failure
from queueplane.run.executor.crash_journal import WORKER_DIED, CrashJournal
from queueplane.run.share.executor.fetcher import RESERVE_FAILURE, reserve_failure


def test_a_record_is_blamed_for_a_death_only_when_it_was_its_processes_only_call(tmp_path):
    journal = CrashJournal(tmp_path, alone_s=5)
    assert reserve_failure(0, 1, [], journal) == RESERVE_FAILURE, "no death: its lock ran out or its worker stopped"

    journal.crashed(0, 2, None)  # a suspect's child died in it
    assert reserve_failure(0, 2, [], journal).error_class == WORKER_DIED
    reason = Failure("MemoryLimitExceeded", "the process passed processing.memoryLimit")
    journal.crashed(0, 3, reason)
    assert reserve_failure(0, 3, [], journal).error_class == "MemoryLimitExceeded"

    journal.crashes[(0, 4)] = 1  # died beside other calls (what collect counts for each of them)
    beside = reserve_failure(0, 4, [], journal)
    assert beside.error_class == RESERVE_FAILURE.error_class
    assert "died 1 time(s)" in beside.message and "beside others" in beside.message


def test_a_parked_record_keeps_the_error_it_was_parked_with(tmp_path):
    journal = CrashJournal(tmp_path, alone_s=5)
    journal.crashed(0, 5, None)
    parked = Failure("ValueError", "bad order")
    headers = dlq.dlq_headers(
        [],
        topic="orders",
        partition=0,
        offset=5,
        delivery_count=3,
        failure=parked,
        first_attempt_ms=1,
        last_attempt_ms=2,
    )
    assert reserve_failure(0, 5, [*headers, (dlq.HEADER_PARKED, b"1")], journal) == parked
