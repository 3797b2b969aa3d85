"""The crash journal: which record a Python worker was in when it died, told to the process after it."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest
from helpers import PLANTED_FOLDERS, plant_folder

from queueplane.run.executor import crash_journal
from queueplane.run.executor.crash_journal import DEAD, NO_DELIVERY, SLOT, SLOTS, SUFFIX, CrashJournal, Delivery
from queueplane.run.executor.private_dirs import PrivateDirRefused


def _die_in_a_call(folder, partition: int, offset: int) -> None:
    """A child process that starts a call and dies in it, after finishing another."""
    pid = os.fork()
    if pid == 0:
        journal = CrashJournal(folder, alone_s=5)
        journal.end(journal.begin(0, 1))  # returned: not blamed
        journal.begin(partition, offset)
        os._exit(1)
    os.waitpid(pid, 0)


def test_the_record_a_process_died_in_is_counted_once_per_death_and_only_it(tmp_path):
    _die_in_a_call(tmp_path, 2, 40)
    _die_in_a_call(tmp_path, 2, 40)
    journal = CrashJournal(tmp_path, alone_s=5)
    assert journal.crashes == {(2, 40): 2}
    assert [p.name for p in tmp_path.glob(f"*{SUFFIX}")] == [journal.path.name], "the dead processes' files went"
    assert CrashJournal(tmp_path, alone_s=5).crashes == {(2, 40): 2}, "counted once, kept for the next process"

    journal.cleared(2, 40)
    assert CrashJournal(tmp_path, alone_s=5).crashes == {}
    journal.dead_lettered(3, 7, (5, 70))  # a copy of (3, 7), read at (5, 70), went to the DLQ
    later = CrashJournal(tmp_path, alone_s=5)
    assert later.crashes == {(3, 7): DEAD}
    assert later.dead_at == {(3, 7): (5, 70)}, "the next process knows which copy went"
    journal.cleared(3, 7)
    assert CrashJournal(tmp_path, alone_s=5).dead_at == {}


def test_a_process_that_died_but_is_not_yet_reaped_counts_as_dead(tmp_path):
    """Spark's daemon may reap its dead workers late: a zombie's calls are blamed all the same."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        journal = CrashJournal(tmp_path, alone_s=5)
        journal.begin(4, 9)
        os.write(ready_w, b"x")
        os._exit(1)
    try:
        os.read(ready_r, 1)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never died"
            time.sleep(0.01)
        assert CrashJournal(tmp_path, alone_s=5).crashes == {(4, 9): 1}
    finally:
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)


def test_the_delivery_a_process_died_in_is_remembered_by_its_copy_and_kept_for_the_next_process(tmp_path):
    began_ms = int(time.time() * 1000) - 2_000
    pid = os.fork()
    if pid == 0:
        journal = CrashJournal(tmp_path, alone_s=5)
        journal.end(journal.begin(0, 1, Delivery(0, 1, began_ms)))  # returned: not blamed
        journal.begin(2, 40, Delivery(1, 77, began_ms))  # a kmq copy at 1:77 of the message first at 2:40
        os._exit(1)
    os.waitpid(pid, 0)
    journal = CrashJournal(tmp_path, alone_s=5)
    assert journal.crashes == {(2, 40): 1}
    assert journal.crashed_deliveries == {(1, 77): began_ms}
    journal.cleared(2, 40)  # the message's call came back: no suspect, but that delivery still died
    assert CrashJournal(tmp_path, alone_s=5).crashed_deliveries == {(1, 77): began_ms}
    _die_in_a_call(tmp_path, 3, 3)  # a call without a delivery (consumer groups) leaves none
    assert CrashJournal(tmp_path, alone_s=5).crashed_deliveries == {(1, 77): began_ms}


def test_a_call_that_had_hung_past_its_deadline_is_not_blamed_for_the_death(tmp_path):
    now_ms = int(time.time() * 1000)
    slots = bytearray(SLOT.size * SLOTS)
    SLOT.pack_into(slots, 0, 1, 0, 10, now_ms - 60_000, *NO_DELIVERY)  # hung for a minute: given up already
    SLOT.pack_into(slots, SLOT.size, 1, 0, 11, now_ms - 100, *NO_DELIVERY)  # the newest call
    SLOT.pack_into(slots, 2 * SLOT.size, 1, 1, 12, now_ms - 2_000, *NO_DELIVERY)  # running 2 s, within its 5 s
    (tmp_path / f"999999999-0{SUFFIX}").write_bytes(bytes(slots))  # no such process
    assert CrashJournal(tmp_path, alone_s=5).crashes == {(0, 11): 1, (1, 12): 1}


def test_a_suspect_runs_alone_after_the_running_call_and_holds_new_ones_back(tmp_path):
    _die_in_a_call(tmp_path, 0, 99)
    journal = CrashJournal(tmp_path, alone_s=5)
    events: list[str] = []
    running = threading.Event()

    def call(name: str, partition: int, offset: int, seconds: float, started: threading.Event | None = None):
        slot = journal.begin(partition, offset)
        events.append(f"{name} begins")
        if started:
            started.set()
        time.sleep(seconds)
        events.append(f"{name} ends")
        journal.end(slot)

    first = threading.Thread(target=call, args=("normal", 0, 1, 0.3, running))
    first.start()
    running.wait()
    suspect = threading.Thread(target=call, args=("suspect", 0, 99, 0.3))
    suspect.start()
    time.sleep(0.1)
    later = threading.Thread(target=call, args=("later", 0, 2, 0))
    later.start()
    for thread in (first, suspect, later):
        thread.join(5)
    assert events == ["normal begins", "normal ends", "suspect begins", "suspect ends", "later begins", "later ends"]


def test_two_suspects_that_wait_behind_a_hanging_call_still_run_one_at_a_time(tmp_path, monkeypatch):
    # The first waits for the hanging call, the second for the first's turn: both bounds run out
    # together, and the second must not start before the first's call ends, or a death in one
    # blames the other (so a memory guard's reason was lost, its record dead-lettered as
    # WorkerDied). A slow poll widens the gap between the two, as a loaded machine's scheduler does.
    monkeypatch.setattr(crash_journal, "ALONE_POLL_S", 0.2)
    _die_in_a_call(tmp_path, 0, 98)
    _die_in_a_call(tmp_path, 0, 99)
    journal = CrashJournal(tmp_path, alone_s=0.5)
    threading.Thread(target=journal.begin, args=(0, 1), daemon=True).start()  # never returns
    spans: dict[int, tuple[float, float]] = {}

    def suspect(offset: int) -> None:
        def handler(_record: None) -> None:
            began = time.monotonic()
            time.sleep(0.3)
            spans[offset] = (began, time.monotonic())

        journal.call(0, offset, handler, None)

    threads = [threading.Thread(target=suspect, args=(offset,)) for offset in (98, 99)]
    for thread in threads:
        thread.start()
        time.sleep(0.01)
    for thread in threads:
        thread.join(5)
    (_, first_ended), (second_began, _) = sorted(spans.values())
    assert second_began >= first_ended, spans


def test_a_suspect_that_hangs_holds_the_others_back_no_longer_than_its_bound(tmp_path):
    _die_in_a_call(tmp_path, 0, 99)
    journal = CrashJournal(tmp_path, alone_s=0.2)
    journal.begin(0, 99)  # never returns
    began = time.monotonic()
    journal.end(journal.begin(0, 1))
    # Without the bound the wait has no end: 5 s is 25 times the bound, room for a busy machine.
    assert time.monotonic() - began < 5.0


def test_a_suspect_does_not_wait_for_a_call_given_up_past_its_deadline(tmp_path):
    _die_in_a_call(tmp_path, 0, 99)
    journal = CrashJournal(tmp_path, alone_s=30)
    hung = threading.Thread(target=journal.begin, args=(0, 1))  # a call that never returns, in its own slot
    hung.start()
    hung.join()
    # Its call started a minute ago: the watchdog gave it up long since, its thread is only kept.
    slot = next(i for i, (used, *_) in enumerate(SLOT.iter_unpack(journal.path.read_bytes())) if used)
    with journal.path.open("r+b") as handle:
        os.pwrite(handle.fileno(), SLOT.pack(1, 0, 1, int(time.time() * 1000) - 60_000, *NO_DELIVERY), slot * SLOT.size)
    began = time.monotonic()
    journal.begin(0, 99)
    # Waiting for the hung call would take the 30 s bound.
    assert time.monotonic() - began < 10, "a suspect waits for the calls that may return, not for a hung one"


def test_a_pool_threads_call_is_blamed_unless_it_was_given_up(tmp_path):
    """Share pool threads note only the record's place; a hung call given up is taken out."""
    pid = os.fork()
    if pid == 0:
        journal = CrashJournal(tmp_path, alone_s=5)
        calling, _ = journal.thread_calls()
        calling(0, 1)
        journal.idle()  # returned: not blamed
        hung = threading.Thread(target=lambda: journal.give_up(_hang(journal)))
        hung.start()
        hung.join()
        calling(2, 40)  # the call the process dies in
        os._exit(1)
    os.waitpid(pid, 0)
    assert CrashJournal(tmp_path, alone_s=5).crashes == {(2, 40): 1}


def _hang(journal: CrashJournal) -> int:
    """Another thread's call, left in its slot as a hung one is; its slot."""
    calling, slot = journal.thread_calls()
    calling(3, 3)
    return slot


def test_a_plain_call_is_blamed_for_a_death_and_a_suspect_or_a_call_beside_one_goes_through_call(tmp_path):
    pid = os.fork()
    if pid == 0:
        enter, leave = CrashJournal(tmp_path, alone_s=5).plain_calls()
        ok = enter(0, 1)
        leave()  # returned: not blamed
        os._exit(0 if ok and enter(5, 50) else 3)  # died in the call of 5:50
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    journal = CrashJournal(tmp_path, alone_s=5)
    assert journal.crashes == {(5, 50): 1}

    enter, leave = journal.plain_calls()
    assert enter(5, 50) is False, "a suspect runs alone, through call"
    suspect_running, release = threading.Event(), threading.Event()

    def suspect() -> None:
        journal.call(5, 50, lambda _: (suspect_running.set(), release.wait(5)), None)

    thread = threading.Thread(target=suspect)
    thread.start()
    suspect_running.wait(5)
    try:
        assert enter(0, 2) is False, "beside a suspect running alone, a call steps back through call"
    finally:
        release.set()
        thread.join(5)
    assert enter(0, 2) is True
    leave()
    # Nothing of this process's is in a call: a process after it that found it dead would blame none.
    assert not any(used for used, *_ in SLOT.iter_unpack(journal.path.read_bytes()))


def _dead_process_with_calls(folder: Path, tag: str, *calls: tuple[int, int]) -> None:
    """The slots a process left when it died in ``calls`` (no such process runs: its tag's pid is unused)."""
    now_ms = int(time.time() * 1000)
    slots = bytearray(SLOT.size * SLOTS)
    for i, (partition, offset) in enumerate(calls):
        SLOT.pack_into(slots, i * SLOT.size, 1, partition, offset, now_ms, *NO_DELIVERY)
    (folder / f"{tag}{SUFFIX}").write_bytes(bytes(slots))


def test_a_death_is_a_records_own_only_when_it_was_the_processes_only_call(tmp_path):
    """A share record's reserve delivery is dead-lettered as WorkerDied only for a death that was its own."""
    _dead_process_with_calls(tmp_path, "999999991-0", (0, 1), (0, 2))  # two calls: either may have killed it
    journal = CrashJournal(tmp_path, alone_s=5)
    assert journal.crashes == {(0, 1): 1, (0, 2): 1}
    assert journal.died_alone == set()

    _dead_process_with_calls(tmp_path, "999999992-0", (0, 2))  # run alone, and it died again
    journal.collect()
    assert journal.crashes == {(0, 1): 1, (0, 2): 2}
    assert journal.died_alone == {(0, 2)}
    journal.crashed(0, 3, None)  # a share suspect's child died in it
    assert journal.died_alone == {(0, 2), (0, 3)}
    assert CrashJournal(tmp_path, alone_s=5).died_alone == {(0, 2), (0, 3)}, "kept for the next process"

    journal.cleared(0, 3)
    assert CrashJournal(tmp_path, alone_s=5).died_alone == {(0, 2)}, "a call that returned clears it"


# -- the folder: this user's alone ------------------------------------------------------------------


def test_a_journal_makes_its_missing_folder_0700(tmp_path):
    CrashJournal(tmp_path / "kitchen", alone_s=5).close()
    assert stat.S_IMODE(os.lstat(tmp_path / "kitchen").st_mode) == 0o700


@pytest.mark.parametrize("planted", PLANTED_FOLDERS)
def test_a_journal_refuses_a_folder_another_user_could_have_written_in(tmp_path, planted):
    folder = plant_folder(tmp_path, planted)
    # What another user would leave: a dead process's calls, blaming a record of their choice.
    SLOT.pack_into(calls := bytearray(SLOT.size * SLOTS), 0, 1, 2, 40, int(time.time() * 1000), *NO_DELIVERY)
    (folder / f"2147483646-1{SUFFIX}").write_bytes(calls)
    with pytest.raises(PrivateDirRefused):
        CrashJournal(folder, alone_s=5)
    assert sorted(p.name for p in folder.iterdir()) == [f"2147483646-1{SUFFIX}"], "nothing read, nothing written"
