"""A share process's outbox (queueplane.run.share.executor.outbox): provisional rows settled by their commit's
answer, a dead process's rows handed on, and the records whose commit never answered registered,
so that their redelivery on this machine is accepted without a call and counted once."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import AcknowledgeType, Message
from helpers import PLANTED_FOLDERS, plant_folder

from queueplane.run.executor import crash_journal
from queueplane.run.executor.crash_journal import CrashJournal, tag_alive
from queueplane.run.executor.handler import MessageRecord
from queueplane.run.executor.private_dirs import PrivateDirRefused
from queueplane.run.outcomes import (
    LAST_OFFSET_COLUMN,
    LATENCY_SLOTS,
    OFFSET_COLUMN,
    OUTCOME_ARROW,
    PARTITION_COLUMN,
    RECORDS_COLUMN,
    TOPIC_COLUMN,
    OutcomeColumns,
    accepted_columns,
)
from queueplane.run.share.executor import outbox as outbox_module
from queueplane.run.share.executor.accepted import AcceptedLately
from queueplane.run.share.executor.fetcher import InOrder, ShareFetcher
from queueplane.run.share.executor.outbox import COUNTED, Outbox
from queueplane.run.share.executor.pool import Poll
from queueplane.run.share.settings import ACCEPTED_RESULT, ALREADY_COUNTED_RESULT

# A pid above any pid_max (2**22 at most): no process has it, so a process of this tag is dead.
DEAD = "2147483646-1"


def _messages(partition: int, offsets: list[int], delivery: int = 1, topic: str = "t") -> list[Message]:
    return [
        Message(topic=topic, partition=partition, offset=o, key=b"k", value=b"v", delivery_count=delivery)
        for o in offsets
    ]


def _block(partition: int, offsets: list[int], delivery: int = 1) -> OutcomeColumns:
    """Rows as the fetcher makes them for records accepted while their poll runs."""
    return accepted_columns(_messages(partition, offsets, delivery), 1.0, [1] * len(offsets))


def _by_offset(blocks: list[OutcomeColumns]) -> list[OutcomeColumns]:
    return sorted(blocks, key=lambda block: block[OFFSET_COLUMN][0])


def _registered(folder) -> list[list[int]]:
    """counted.json's (partition, offset, delivery count)s."""
    return sorted(entry[:3] for entry in json.loads((folder / COUNTED).read_text()))


def test_a_dead_tag_is_dead():
    assert not tag_alive(DEAD)


def test_provisional_rows_are_not_taken_until_their_commit_is_confirmed(tmp_path):
    outbox = Outbox(tmp_path)
    block = _block(0, [1, 2])
    token = outbox.add_provisional([block])
    assert not outbox.holds(), "a batch waiting for rows is not woken by provisional ones"
    assert outbox.take() == []
    assert outbox.take() == [], "kept provisional across takes"
    assert outbox.settle(token, set()) == [block], "the rows that count"
    assert outbox.holds()
    assert outbox.take() == [block]
    assert outbox.take() == []
    assert outbox.settle(token, set()) == [], "settled once; a second answer changes nothing"
    assert outbox.take() == []


def test_provisional_rows_are_dropped_when_the_commit_failed(tmp_path):
    outbox = Outbox(tmp_path)
    failed = outbox.add_provisional([_block(0, [1, 2])])
    assert outbox.settle(failed, None) == []
    assert not outbox.holds()
    assert outbox.take() == [], "the broker redelivers them: their next handling counts them"


def test_rows_of_partitions_the_commit_did_not_record_are_dropped_and_the_others_count(tmp_path):
    outbox = Outbox(tmp_path)
    rows = accepted_columns([*_messages(0, [1]), *_messages(1, [2, 3]), *_messages(0, [4])], 1.0, [1, 2, 3, 4])
    token = outbox.add_provisional([rows])
    counted = outbox.settle(token, {("t", 0), ("other", 1)})
    assert outbox.take() == counted == [accepted_columns(_messages(1, [2, 3]), 1.0, [2, 3])]


def test_a_dead_processes_file_hands_on_its_settled_and_unsettled_rows_and_registers_their_records(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    settled = _block(0, [1])
    confirmed = _block(0, [2, 3])
    unsettled = _block(1, [10, 11], delivery=2)
    dropped = _block(1, [20])
    dead.add([settled])
    dead.settle(dead.add_provisional([confirmed]), set())
    dead.add_provisional([unsettled])  # its commit was under way when the process died
    dead.settle(dead.add_provisional([dropped]), None)

    outbox = Outbox(tmp_path)
    assert _by_offset(outbox.take()) == [settled, confirmed, unsettled], "the dropped rows are not handed on"
    # A settled row's acknowledgement may still have been on its way too (it rides on the next poll).
    assert _registered(tmp_path) == [[0, 1, 1], [0, 2, 1], [0, 3, 1], [1, 10, 2], [1, 11, 2]], "not the dropped"
    assert [p.name for p in tmp_path.glob("*.outbox*")] == [outbox.path.name], "the dead file is gone"
    assert Outbox(tmp_path).take() == [], "handed on once"


def test_a_file_claimed_by_a_process_that_died_before_handing_it_on_is_taken_over(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    settled = _block(0, [1])
    unsettled = _block(1, [10], delivery=2)
    dead.add([settled])
    dead.add_provisional([unsettled])
    claimer = "2147483645-1"  # dead too: it renamed the file, then died before copying its rows
    dead.path.rename(tmp_path / f"{DEAD}.outbox.{claimer}")

    outbox = Outbox(tmp_path)
    assert _by_offset(outbox.take()) == [settled, unsettled]
    assert _registered(tmp_path) == [[0, 1, 1], [1, 10, 2]]
    assert [p.name for p in tmp_path.glob("*.outbox*")] == [outbox.path.name], "the claimed file is gone"


def test_a_file_a_living_process_has_claimed_is_left_to_it(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    dead.add([_block(0, [1])])
    claimed = tmp_path / f"{DEAD}.outbox.{crash_journal.process_tag()}"  # this process: alive
    dead.path.rename(claimed)

    assert Outbox(tmp_path, tag="2147483645-1").take() == []
    assert claimed.exists()


def test_a_dead_processes_partial_file_is_removed_and_its_own_file_handed_on(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    settled = _block(0, [1])
    dead.add([settled])
    partial = tmp_path / f"{DEAD}.outbox.partial"  # it died writing it, before the rename
    partial.write_bytes(b"cut short")
    writing = tmp_path / f"{crash_journal.process_tag()}.outbox.partial"  # a living process's, being written
    writing.write_bytes(b"")

    assert Outbox(tmp_path, tag="2147483645-1").take() == [settled]
    assert not partial.exists()
    assert writing.exists()


def test_a_partial_left_by_a_writer_of_counted_json_that_died_is_not_left_behind(tmp_path):
    (tmp_path / f"{COUNTED}.partial").write_text("[[0, 5,")  # a writer killed mid-write
    Outbox(tmp_path, tag=DEAD).add_provisional([_block(0, [5], delivery=2)])
    Outbox(tmp_path).adopt()
    assert _registered(tmp_path) == [[0, 5, 2]]
    assert sorted(p.name for p in tmp_path.glob(f"{COUNTED}*")) == [COUNTED]


def test_a_registered_record_is_recognised_at_a_higher_delivery_count_only_until_it_expires(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    dead.add_provisional([_block(0, [5, 6, 7], delivery=2)])
    outbox = Outbox(tmp_path)
    outbox.adopt()
    assert outbox.redelivered_counted([(0, 5, 2), (0, 6, 1), (1, 5, 3)]) == set(), "equal, lower, another partition"
    assert outbox.redelivered_counted([(0, 4, 3), (0, 5, 3), (0, 7, 4)]) == {1, 2}
    # The acknowledgement of the delivery that found it may not land either: the next one is found too.
    assert outbox.redelivered_counted([(0, 5, 4), (0, 7, 5)]) == {0, 1}
    assert _registered(tmp_path) == [[0, 5, 2], [0, 6, 2], [0, 7, 2]]
    assert Outbox(tmp_path).redelivered_counted([(0, 6, 3)]) == {0}, "by every process of the queue"


def test_a_registered_record_is_forgotten_after_an_hour(tmp_path, monkeypatch):
    Outbox(tmp_path, tag=DEAD).add_provisional([_block(0, [5])])
    Outbox(tmp_path).adopt()
    later = time.time() + crash_journal.DELIVERY_MEMORY_S + 60
    monkeypatch.setattr(outbox_module.time, "time", lambda: later)
    assert Outbox(tmp_path).redelivered_counted([(0, 5, 2)]) == set()


def test_a_take_keeps_the_provisional_rows_on_disk_for_the_next_process(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    provisional = _block(0, [1])
    confirmed_later = _block(0, [2])
    settled = _block(0, [3])
    dead.add_provisional([provisional])
    token = dead.add_provisional([confirmed_later])
    dead.add([settled])
    assert dead.take() == [settled]
    dead.settle(token, set())  # after the take: written to the file the take left
    dead.add([_block(0, [4])])  # the process dies before the next take

    outbox = Outbox(tmp_path)
    assert _by_offset(outbox.take()) == [provisional, confirmed_later, _block(0, [4])]
    assert _registered(tmp_path) == [[0, 1, 1], [0, 2, 1], [0, 4, 1]], "every row handed on; 3 was taken for good"


def test_an_outbox_closed_with_provisional_rows_leaves_them_to_the_next_process(tmp_path):
    outbox = Outbox(tmp_path)
    outbox.add_provisional([_block(0, [1])])
    outbox.close()
    assert outbox.path.exists()


# -- the fetcher's side: a redelivery of a registered record ------------------------------------


def _host(tmp_path) -> SimpleNamespace:
    """What ``ShareFetcher._calls`` reads of its process: real crash journal and outbox in ``tmp_path``."""
    return SimpleNamespace(
        settings=SimpleNamespace(delivery_limit=3),
        journal=CrashJournal(tmp_path, alone_s=5),
        outbox=Outbox(tmp_path),
        accepted=AcceptedLately(60),
    )


def _fetcher(host: SimpleNamespace) -> ShareFetcher:
    """A fetcher without a consumer (``_calls`` and ``_decide`` use none)."""
    fetcher = ShareFetcher.__new__(ShareFetcher)
    fetcher.host = host
    fetcher.index = 0
    return fetcher


def test_a_redelivered_record_a_dead_process_counted_is_accepted_without_a_call_or_a_row(tmp_path):
    # The process died during the commit of records 5 and 6's acknowledgements, before anyone
    # took over its file: the poll that redelivers them takes it over first.
    Outbox(tmp_path, tag=DEAD).add_provisional([_block(0, [5, 6])])
    host = _host(tmp_path)
    fetcher = _fetcher(host)
    # 5 comes back (the commit did not land), beside 7, handled by the dead process and released,
    # and 8 past the delivery limit.
    messages = [*_messages(0, [5, 7], delivery=2), *_messages(0, [8], delivery=4)]
    poll = Poll(messages, time.monotonic() + 60)
    calls, suspects = fetcher._calls(messages, poll)
    assert (list(calls), suspects) == ([1], [])
    assert poll.results[0] is ALREADY_COUNTED_RESULT
    assert poll.unsettled == 1, "decided without a call"
    assert _by_offset(host.outbox.take()) == [_block(0, [5, 6])], "the dead process's rows count them"
    assert _registered(tmp_path) == [[0, 5, 1], [0, 6, 1]]

    outcome, ack = fetcher._decide(MessageRecord.many(messages)[0], poll.results[0], 0, time.monotonic(), 1.0)
    assert (outcome, ack) == (None, AcknowledgeType.ACCEPT), "accepted, no row"

    in_order = InOrder(messages)
    poll.results[1] = ACCEPTED_RESULT
    assert in_order.accepted(poll.results) == [0, 1], "it does not hold back the records after it"
    assert in_order.counted

    again = [*_messages(0, [5], delivery=3), *_messages(0, [9], delivery=2)]
    poll = Poll(again, time.monotonic() + 60)
    assert list(fetcher._calls(again, poll)[0]) == [1], "a later delivery of it is found again; 9 was never counted"


# -- what another user could leave: the folder is refused, and the files are data ----------------


class _Planted:
    """A pickle that runs code when loaded: here it makes a file, the marker of its having run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_an_outbox_file_holding_a_pickle_is_not_run_and_its_rows_are_not_counted(tmp_path):
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    settled = _block(0, [1])
    dead = Outbox(tmp_path, tag=DEAD)
    dead.add([settled])
    dead.close()
    # After a whole entry: a pickle that would run code, then a settled entry of its own making.
    with dead.path.open("ab") as handle:
        handle.write(pickle.dumps((0, 0, [_Planted(marker)])) + b"\n")
        handle.write(pickle.dumps((0, 0, [_block(0, [666])]), protocol=0))

    assert Outbox(tmp_path).take() == [settled], "the rows before it, and nothing from it or after it"
    assert not marker.exists(), "the pickle was not loaded"


# A settled entry of one run's row, as an outbox writes it; _altered(i, column) puts another column in place i.
_RUN = [["t"], [0], [5], [7], [3], [None], [1], ["accepted"], [None], [3.0], [[3] + [0] * (LATENCY_SLOTS - 1)], [1]]


def _altered(index: int, column: object) -> list:
    return [0, 0, [[column if i == index else values for i, values in enumerate(_RUN)]]]


@pytest.mark.parametrize(
    "entry",
    [
        [0, 0, [_RUN[:3]]],  # three columns of twelve
        _altered(OFFSET_COLUMN, ["five"]),  # an offset as text
        _altered(PARTITION_COLUMN, [0, 1]),  # columns of two lengths
        _altered(TOPIC_COLUMN, {"all": "t", "rows": 1, "more": 2}),
        _altered(RECORDS_COLUMN, [4]),  # records that are not the span of the row's offsets
        _altered(LAST_OFFSET_COLUMN, [4]),  # a span that ends before it starts
        _altered(LAST_OFFSET_COLUMN, [None]),
        _altered(OUTCOME_ARROW.get_field_index("latency_buckets"), [[3]]),  # counts of too few buckets
        [1, "token", []],
        [2, 1, [["t", "0"]]],  # a partition as text
        [7, 0, None],  # no such kind
        {"kind": 0},
    ],
)
def test_an_entry_that_is_not_one_an_outbox_writes_ends_the_reading(tmp_path, entry):
    settled = _block(0, [1])
    dead = Outbox(tmp_path, tag=DEAD)
    dead.add([settled])
    dead.close()
    with dead.path.open("ab") as handle:
        handle.write(json.dumps(entry).encode() + b"\n")
        handle.write(json.dumps([0, 0, [[list(column) for column in _block(0, [2])]]]).encode() + b"\n")

    assert Outbox(tmp_path).take() == [settled]


def test_an_entry_cut_short_ends_the_reading(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    settled = _block(0, [1])
    dead.add([settled])
    dead.add([_block(0, [2, 3])])
    dead.close()
    whole = dead.path.read_bytes()
    dead.path.write_bytes(whole[: whole.index(b"\n") + 1 + 20])  # it died writing the second entry

    assert Outbox(tmp_path).take() == [settled]


def test_rows_of_every_column_type_cross_the_file_as_they_were(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    rows = (
        ["t", "t"],
        [0, 1],
        [2**40, 5],
        [2**40 + 2, 5],
        [3, 1],
        [None, "ключ"],
        [1, 2],
        ["accepted", "released"],
        [None, 'Retry: "quoted"\nand a line'],
        [0.375, 3.0],
        [[3] + [0] * (LATENCY_SLOTS - 1), None],
        [1, 1],
    )
    dead.add_provisional([rows])
    dead.add([_block(0, [1, 2, 3])])
    assert _by_offset(Outbox(tmp_path).take()) == [_block(0, [1, 2, 3]), rows]


@pytest.mark.parametrize("planted", PLANTED_FOLDERS)
def test_an_outbox_refuses_a_folder_another_user_could_have_written_in(tmp_path, planted):
    folder = plant_folder(tmp_path, planted)
    with pytest.raises(PrivateDirRefused):
        Outbox(folder)
    assert list(folder.iterdir()) == [], "no file of its own made there"


# -- rows handed to a task stay in the file until Spark has them ---------------------------------

TASK = ("stream-a", 5, 0)  # (stream, batch, slot)


def _began(tmp_path, task, tag: str | None = None) -> Outbox:
    """An outbox of a process running ``task``."""
    outbox = Outbox(tmp_path, tag=tag)
    outbox.begin(task)
    return outbox


def test_rows_taken_by_a_task_whose_process_died_before_it_ended_are_handed_to_its_retry_once(tmp_path):
    taken, after = _block(0, [1, 2]), _block(0, [3])
    pid = os.fork()
    if pid == 0:  # the process of the task's first attempt: it takes the rows, then dies before Spark has them
        outbox = Outbox(tmp_path)
        outbox.begin(TASK)
        outbox.add([taken])
        ok = outbox.take() == [taken]
        outbox.add([after])  # settled after the take
        os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0

    retry = _began(tmp_path, TASK)  # Spark runs the task again in another process
    assert _by_offset(retry.take()) == [taken, after], "the rows the dead attempt took, and those after"
    assert list(tmp_path.glob("handed*")) == []
    retry.begin(("stream-a", 6, 0))
    assert retry.take() == []
    assert _began(tmp_path, TASK, tag="2147483645-1").take() == [], "handed on once"


def test_rows_handed_to_a_task_that_ended_are_not_handed_again(tmp_path):
    dead = _began(tmp_path, TASK, tag=DEAD)
    taken, after = _block(0, [1, 2]), _block(0, [3])
    dead.add([taken])
    assert dead.take() == [taken]
    dead.add([after])  # the task ended; the process died before its next task started

    assert _began(tmp_path, ("stream-a", 6, 1)).take() == [after], "a later batch: the task had ended"
    assert not dead.path.exists()
    assert list(tmp_path.glob("handed*")) == []


def test_rows_handed_to_a_task_of_another_stream_are_not_handed_again(tmp_path):
    dead = _began(tmp_path, ("an older query", 57, 0), tag=DEAD)
    dead.add([_block(0, [1])])
    dead.take()
    # A new query counts its batches from one again: its batch 3 says nothing of the older one's 57.
    assert _began(tmp_path, ("stream-a", 3, 0)).take() == []
    assert list(tmp_path.glob("handed*")) == [], "dropped, not kept for a retry that never comes"


def test_rows_of_a_task_of_the_batch_under_way_wait_for_its_retry_or_the_next_batch(tmp_path):
    taken = _block(0, [1, 2])
    dead = _began(tmp_path, TASK, tag=DEAD)
    dead.add([taken])
    dead.take()

    sibling = _began(tmp_path, ("stream-a", 5, 1))  # another task of the same batch takes the file over
    assert sibling.take() == [], "the task may have ended, or may be run again"
    assert not dead.path.exists()
    assert _began(tmp_path, TASK, tag="2147483645-1").take() == [taken], "its retry hands them"
    assert list(tmp_path.glob("handed*")) == []

    dead = _began(tmp_path, ("stream-a", 7, 0), tag=DEAD)
    dead.add([taken])
    dead.take()
    sibling.begin(("stream-a", 7, 1))
    assert sibling.take() == []
    sibling.begin(("stream-a", 8, 1))  # batch 7 ended: every task of it did, the dead one's too
    assert sibling.take() == []
    assert list(tmp_path.glob("handed*")) == []
    assert _began(tmp_path, ("stream-a", 7, 0), tag="2147483645-1").take() == [], "dropped, not kept"


def test_a_process_that_runs_the_same_task_again_hands_its_rows_again(tmp_path):
    outbox = _began(tmp_path, TASK)
    taken, after = _block(0, [1]), _block(0, [2])
    outbox.add([taken])
    assert outbox.take() == [taken]
    outbox.add([after])
    outbox.begin(TASK)  # the task failed after this worker gave Spark its rows: Spark runs it here again
    assert _by_offset(outbox.take()) == [taken, after]
    outbox.begin(("stream-a", 6, 0))
    assert outbox.take() == []


def test_the_next_task_removes_the_rows_handed_to_the_last_from_the_file(tmp_path):
    outbox = _began(tmp_path, TASK, tag=DEAD)
    provisional, confirmed_later, taken, after = _block(0, [1]), _block(0, [2]), _block(0, [3]), _block(0, [4])
    outbox.add_provisional([provisional])
    token = outbox.add_provisional([confirmed_later])
    outbox.add([taken])
    assert outbox.take() == [taken]
    outbox.settle(token, set())  # after the take: written after its mark
    outbox.add([after])
    outbox.begin(("stream-a", 6, 0))  # then the process dies in its next task, before a take
    assert outbox_module._read(outbox.path)[2] == {}, "no rows handed to a task left in the file"

    # Taken over by the retry of that next task: the rows of task 5 are not in the file any more,
    # whatever the adopter makes of a mark.
    assert _by_offset(_began(tmp_path, ("stream-a", 6, 0)).take()) == [provisional, confirmed_later, after]
    assert _registered(tmp_path) == [[0, 1, 1], [0, 2, 1], [0, 4, 1]]


def test_an_outbox_closed_with_rows_handed_to_a_task_leaves_them_to_the_next_process(tmp_path):
    outbox = _began(tmp_path, TASK)
    outbox.add([_block(0, [1])])
    outbox.take()
    outbox.close()
    assert outbox.path.exists()
    assert _began(tmp_path, ("stream-a", 6, 0), tag="2147483645-1").take() == []


def test_a_mark_that_is_not_a_task_ends_the_reading(tmp_path):
    dead = Outbox(tmp_path, tag=DEAD)
    settled = _block(0, [1])
    dead.add([settled])
    dead.close()
    with dead.path.open("ab") as handle:
        handle.write(json.dumps([4, 0, ["stream-a", "5", 0]]).encode() + b"\n")
    assert _began(tmp_path, ("stream-a", 9, 0)).take() == [settled], "not read as handed to a task"


def _lock_waited_for(folder) -> bool:
    """Whether a process or thread waits for the folder's lock (a blocked flock in /proc/locks)."""
    inode = os.stat(folder / "lock").st_ino
    return any("->" in line and f":{inode} " in line for line in Path("/proc/locks").read_text().splitlines())


def test_a_retry_sees_the_rows_a_sibling_task_is_moving_to_handed_jsonl_at_that_moment(tmp_path):
    """Another task's process claims the dead attempt's file (under the folder's lock) just as the
    retry takes: the retry waits for the lock and finds the rows in handed.jsonl, instead of
    finding neither a dead file nor handed.jsonl and leaving the rows to be dropped by the next batch."""
    taken = _block(0, [1, 2])
    dead = _began(tmp_path, TASK, tag=DEAD)
    dead.add([taken])
    dead.take()
    dead.close()
    retry = _began(tmp_path, TASK, tag="2147483645-1")
    claimed, done = threading.Event(), threading.Event()

    def sibling() -> None:  # a living process's claim, as ``adopt`` makes it, paused under the lock
        with crash_journal.folder_lock(tmp_path):
            path = dead.path.rename(tmp_path / f"{DEAD}.outbox.{crash_journal.process_tag()}")
            claimed.set()
            while not _lock_waited_for(tmp_path) and not done.wait(0.01):
                pass
            handed = outbox_module._read(path)[2]
            (tmp_path / outbox_module.HANDED).write_bytes(
                b"".join(
                    outbox_module._entry(0, 0, rows) + outbox_module._entry(outbox_module.TAKEN, 0, task)
                    for task, rows in handed.items()
                )
            )
        path.unlink()

    thread = threading.Thread(target=sibling)
    thread.start()
    claimed.wait()
    try:
        assert retry.take() == [taken]
    finally:
        done.set()
        thread.join()
