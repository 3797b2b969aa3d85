"""A share suspect's call in a child process, and the outcome rows a dead share process leaves."""

from __future__ import annotations

import json
import os
import pickle
import time

import pytest

from queueplane.handler_api import Output, Record, Reject
from queueplane.run.dead_letters import Failure
from queueplane.run.executor.crash_journal import WORKER_DIED, CrashJournal
from queueplane.run.executor.memory_guard import MEMORY_LIMIT_EXCEEDED
from queueplane.run.executor.outputs import output_record
from queueplane.run.outcomes import Outcome, columns_of
from queueplane.run.share.executor import isolated
from queueplane.run.share.executor.isolated import ChildFailed, ChildRejected, IsolatedCalls
from queueplane.run.share.executor.outbox import Outbox

HANDLER = """
import os, time
from queueplane import Output, Reject

def handle(record):
    mode = record.value.decode()
    if mode == "echo":
        return Output(record.value, key=record.key, headers={"pid": str(os.getpid())})
    if mode == "reject":
        raise Reject("refused")
    if mode == "raise":
        raise ValueError("bad value")
    if mode == "bad_return":
        return 42
    if mode == "os_exit":
        os._exit(1)
    if mode == "hog":
        held = []
        while len(held) < 64:
            held.append(b"x" * (64 << 20))
    if mode == "hang":
        time.sleep(3600)
    if mode == "fields":
        return [Output({"a": [1, "é"]}, key="k2", headers={"h": "v", "b": b"\\x00\\xff"}, topic="other"), "text", b""]
    if mode == "look":  # where the child's verdict will be: the folders beside the journal's files
        folder = record.key.decode()
        return [
            Output(f"{name} {os.lstat(os.path.join(folder, name)).st_mode & 0o777:o}")
            for name in sorted(os.listdir(folder))
            if os.path.isdir(os.path.join(folder, name))
        ]
"""


def _record(mode: str, offset: int = 7) -> Record:
    return Record(b"k", mode.encode(), (("h", b"v"),), "t", 1, offset, 2, 0)


@pytest.fixture
def calls(tmp_path) -> IsolatedCalls:
    (tmp_path / "suspect_handler.py").write_text(HANDLER)
    return IsolatedCalls("suspect_handler:handle", [str(tmp_path)], "out", memory_limit_mi=512)


def test_a_suspect_that_returns_is_cleared_and_its_outputs_come_back(tmp_path, calls):
    journal = CrashJournal(tmp_path / "journal", alone_s=5)
    journal.crashed(1, 7, None)
    outputs = calls.call(journal, _record("echo"), timeout_s=60)
    assert [(type(o), o.value, o.key) for o in outputs] == [(Output, b"echo", b"k")]
    assert outputs[0].headers["pid"] != str(os.getpid()).encode(), "called in another process"
    assert journal.crashes == {}, "it came back: no suspect any more"


def test_a_suspects_outputs_are_written_as_the_parent_would_have_written_them(tmp_path, calls):
    journal = CrashJournal(tmp_path / "journal", alone_s=5)
    record = _record("fields")
    outputs = calls.call(journal, record, timeout_s=60)
    returned = [
        Output({"a": [1, "é"]}, key="k2", headers={"h": "v", "b": b"\x00\xff"}, topic="other"),
        Output("text"),
        Output(b""),
    ]
    assert [output_record(o, record, "out") for o in outputs] == [output_record(o, record, "out") for o in returned]


def test_the_childs_verdict_is_written_in_a_private_folder_inside_the_journals(tmp_path, calls):
    journal = CrashJournal(tmp_path / "journal", alone_s=5)
    record = Record(str(journal.folder).encode(), b"look", (), "t", 1, 7, 2, 0)
    [seen] = calls.call(journal, record, timeout_s=60)
    name, mode = seen.value.decode().split()
    assert name.startswith("suspect-")
    assert mode == "700"
    assert not [p for p in journal.folder.iterdir() if p.is_dir()], "removed after the call"


def test_a_verdict_file_is_read_as_data_and_a_pickle_in_it_is_not_run(tmp_path):
    marker = tmp_path / "ran"
    planted = tmp_path / "verdict"
    planted.write_bytes(pickle.dumps(_Planted(marker)))
    assert isolated._read(str(planted)) is None, "no verdict: counted as the child's death"
    assert not marker.exists(), "the pickle was not loaded"


@pytest.mark.parametrize(
    "verdict",
    [
        {"returned": [{"key": None, "value": "AAAA!", "headers": None, "topic": None}]},
        {"returned": [{"key": None, "value": None, "headers": [[1, "AAAA"]], "topic": None}]},
        {"returned": [{"key": None, "value": None, "headers": None, "topic": 3}]},
        {"raised": {"error_class": "Reject", "message": "no"}, "rejected": "yes"},
        {"ended": {"error_class": 1, "message": "no"}},
        {"returned": [], "ended": {"error_class": "E", "message": "m"}},
        {"raised": {"error_class": "Reject", "message": "no"}, "rejected": True, "outputs": []},
        ["returned", []],
    ],
)
def test_a_verdict_that_is_not_one_a_child_writes_is_none(tmp_path, verdict):
    path = tmp_path / "verdict"
    path.write_text(json.dumps(verdict))
    assert isolated._read(str(path)) is None


class _Planted:
    """A pickle that runs code when loaded: here it makes a file, the marker of its having run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize(
    ("mode", "raised", "error_class"),
    [
        ("reject", ChildRejected, "Reject"),
        ("bad_return", ChildRejected, "InvalidOutput"),
        ("raise", ChildFailed, "ValueError"),
    ],
)
def test_a_suspect_that_fails_fails_as_it_would_in_the_parent(tmp_path, calls, mode, raised, error_class):
    journal = CrashJournal(tmp_path / "journal", alone_s=5)
    with pytest.raises(raised) as failed:
        calls.call(journal, _record(mode), timeout_s=60)
    assert Failure.of(failed.value).error_class == error_class
    assert isinstance(failed.value, Reject) == (raised is ChildRejected)


def test_a_suspect_that_kills_its_child_counts_a_crash_and_the_parent_lives(tmp_path, calls):
    journal = CrashJournal(tmp_path / "journal", alone_s=5)
    for deaths in (1, 2):
        with pytest.raises(ChildFailed) as failed:
            calls.call(journal, _record("os_exit"), timeout_s=60)
        failure = Failure.of(failed.value)
        assert failure.error_class == WORKER_DIED
        assert f"died {deaths} time(s)" in failure.message
        assert CrashJournal(tmp_path / "journal", alone_s=5).crashes == {(1, 7): deaths}, "kept for every process"


def test_a_suspect_past_the_memory_limit_says_so(tmp_path, calls):
    journal = CrashJournal(tmp_path / "journal", alone_s=5)
    with pytest.raises(ChildFailed) as failed:
        calls.call(journal, _record("hog"), timeout_s=60)
    failure = Failure.of(failed.value)
    assert failure.error_class == MEMORY_LIMIT_EXCEEDED
    assert "over processing.memoryLimit (512 MiB)" in failure.message


def test_a_suspect_that_hangs_is_killed_at_its_deadline(tmp_path, calls):
    journal = CrashJournal(tmp_path / "journal", alone_s=5)
    started = time.monotonic()
    with pytest.raises(ChildFailed) as failed:
        calls.call(journal, _record("hang"), timeout_s=3)
    assert Failure.of(failed.value).error_class == "Timeout"
    assert time.monotonic() - started < 10
    assert journal.crashes == {}, "a hang is not a crash"


def test_the_rows_of_a_process_that_died_are_handed_on_once(tmp_path):
    block = columns_of([Outcome("t", 0, 5, None, 1, "accepted", None, 1.0, 1)])
    pid = os.fork()
    if pid == 0:
        outbox = Outbox(tmp_path)
        outbox.add([block])
        outbox.add([block, block])
        taken = outbox.take()
        outbox.add([block])  # settled after the last batch took its rows, then the process died
        os._exit(0 if len(taken) == 3 else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    outbox = Outbox(tmp_path)
    outbox.add([block])
    assert outbox.take() == [block, block], "the dead process's one untaken block, then this one's"
    assert outbox.take() == []
    assert Outbox(tmp_path).take() == [], "handed on once"
