"""The call guard: a process stuck in a client call past its timeout ends itself, and blames no record."""

from __future__ import annotations

import logging
import os
import sys
import time

from queueplane.run.executor.call_guard import EXIT_CODE, CallGuard
from queueplane.run.executor.crash_journal import CrashJournal


def _child(folder, timeout_s: float, call_s: float) -> tuple[int, float]:
    """A process with a guard (0.3 s grace) whose record 1:5 is in a handler call (its journal slot
    taken) while a client call given ``timeout_s`` takes ``call_s``; its exit status and how long it lived."""
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:
        logging.getLogger("queueplane.worker").addHandler(logging.StreamHandler(sys.stderr))
        journal = CrashJournal(folder, alone_s=5)
        guard = CallGuard(journal.disown, grace_s=0.3, interval_s=0.05)
        journal.begin(1, 5)
        with guard.bounded("send_offsets_to_transaction", timeout_s):
            time.sleep(call_s)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), time.monotonic() - began


def test_a_call_past_its_timeout_and_grace_ends_the_process_and_blames_no_record(tmp_path):
    status, lived = _child(tmp_path, timeout_s=0.2, call_s=30)
    assert status == EXIT_CODE
    assert lived < 10, "ended at the call's deadline, not when the call returned"
    assert CrashJournal(tmp_path, alone_s=5).crashes == {}, "the record in a handler call did not kill the process"


def test_a_call_within_its_timeout_and_grace_lets_the_process_run_on(tmp_path):
    assert _child(tmp_path, timeout_s=0.2, call_s=0.3)[0] == 0


def test_a_process_killed_outside_the_guard_still_blames_its_record(tmp_path):
    """The control: without ``disown`` the same record would be counted, so the first test's empty
    count is the guard's doing."""
    pid = os.fork()
    if pid == 0:
        CrashJournal(tmp_path, alone_s=5).begin(1, 5)
        os._exit(EXIT_CODE)
    os.waitpid(pid, 0)
    assert CrashJournal(tmp_path, alone_s=5).crashes == {(1, 5): 1}


def test_the_guard_names_the_stuck_call_and_its_timeout(tmp_path, capfd):
    _child(tmp_path, timeout_s=0.2, call_s=30)
    err = capfd.readouterr().err
    assert "send_offsets_to_transaction has not returned" in err
    assert "past its own 0.2s timeout" in err
