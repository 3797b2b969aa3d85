"""A kmq member's crash suspects start alone: each in a task of its own, after the rest ended.

A process death costs every record of its task that started and did not end a delivery (the
tracker redelivers them one count higher). A suspect started beside other records could kill
them a delivery each time, and a record that only waited beside killers would reach its limit
without a call that returned; alone, it costs only itself.
"""

from __future__ import annotations

from kmq_fakes import MARKERS, kmq_process

from queueplane.handler_api import Record
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.executor.member import _Running, suspects_apart
from queueplane.run.kmq.executor.tasks import KmqTask


def _records(count: int) -> list[Record]:
    return [Record(b"k", b"v", (), "q", 0, offset, 1, 0) for offset in range(count)]


def test_without_crashes_a_task_is_its_records_as_they_came():
    records = _records(4)
    assert suspects_apart(records, {}) == ([records], False)
    assert suspects_apart(records, {(0, 99): 1}) == ([records], False)
    assert suspects_apart([], {(0, 1): 1}) == ([], False)


def test_suspects_run_after_the_others_each_alone_the_fewest_crashes_first():
    records = _records(6)
    parts, suspects = suspects_apart(records, {(0, 1): 2, (0, 3): 1, (0, 4): 1})
    assert suspects
    assert [[r.offset for r in part] for part in parts] == [[0, 2, 5], [3], [4], [1]]
    only, _ = suspects_apart(records[1:2], {(0, 1): 1})
    assert [[r.offset for r in part] for part in only] == [[1]]


def test_a_copy_is_a_suspect_by_the_message_it_copies():
    headers = km.redelivery_headers((), km.Origin("q", 0, 7, None), 2, 1000)
    copy = Record(b"k", b"v", headers, "q", 0, 40, 2, 0)
    parts, suspects = suspects_apart([*_records(2), copy], {(0, 7): 1})
    assert suspects and [[r.offset for r in part] for part in parts] == [[0, 1], [40]]


def test_a_suspects_start_marker_goes_out_only_after_the_tasks_before_it_ended(tmp_path):
    called: list[int] = []
    process = kmq_process(tmp_path, lambda record: called.append(record.offset))

    parts, _ = suspects_apart(_records(5), {(0, 1): 1, (0, 3): 1})
    running = _Running({0: (0, 5)}, [], {0: 0})
    running.tasks = [KmqTask(process, part) for part in parts]  # type: ignore[arg-type]
    running.tasks[0].start()
    running.settle()
    assert running.error is None
    assert sorted(row.offset for row in running.drain()) == [0, 1, 2, 3, 4]
    assert called.index(1) > max(called.index(0), called.index(2), called.index(4))
    assert called.index(3) > called.index(1)

    # The markers in the order they were written: the others start and end, then each suspect.
    events = []
    for _topic, key, value in process.producer.to(MARKERS):
        for marker in km.decode(key, value):
            events.append((marker.kind, marker.offset))
    first_suspect_start = events.index((km.START, 1))
    assert {(km.END, o) for o in (0, 2, 4)} <= set(events[:first_suspect_start])
    assert events.index((km.END, 1)) < events.index((km.START, 3))
