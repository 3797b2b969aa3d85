"""Rows a group member committed and never reported: counted by the next member only as far as
the group's committed offsets say they were committed."""

from __future__ import annotations

import json
import time

from queueplane.run.consumer.executor.unreported import HANDED_KEPT_S, SUFFIX, SliceId, Unreported


def test_a_dead_process_ranges_below_the_groups_commit_are_collected_once_and_the_rest_dropped(tmp_path):
    dead = tmp_path / f"999999999-1{SUFFIX}"  # no such process
    # partition 0: [0,10) with 10 rows committed; [10,20) noted but never committed; partition 1: [5,8)
    dead.write_text(json.dumps([[0, -1, 10, 10], [0, 10, 20, 9], [1, 5, 8, 3]]))
    member = Unreported(tmp_path)
    asked = []

    def committed(partitions):
        asked.append(partitions)
        return {0: 10, 1: 8}

    assert sorted(member.collect(committed)) == [(0, -1, 10, 10), (1, 5, 8, 3)]
    assert asked == [[0, 1]]
    assert not dead.exists()
    assert member.collect(committed) == [], "collected once"


def test_a_live_process_ranges_are_left_alone_and_reported_ones_cleared(tmp_path):
    member = Unreported(tmp_path)
    first = member.committing(0, -1, 10, 10)
    member.committing(1, -1, 4, 4)
    other = Unreported(tmp_path)
    assert other.collect(lambda _parts: {0: 10, 1: 4}) == [], "its process is alive"
    member.failed(first)
    assert json.loads(member.path.read_text()) == [[1, -1, 4, 4]]
    member.close()
    assert not member.path.exists()


def test_only_a_dead_process_file_is_left_to_collect(tmp_path):
    """What the member looks at each commit tick, so a dead process's count does not wait for a
    rebalance the run may end before."""
    member = Unreported(tmp_path)
    member.committing(0, -1, 10, 10)
    alive = Unreported(tmp_path)
    assert not alive.dead_left(), "its own file and a live process's are not"
    (tmp_path / f"999999999-1{SUFFIX}").write_text(json.dumps([[0, 10, 12, 2]]))
    assert alive.dead_left()
    alive.collect(lambda _parts: {0: 12})
    assert not alive.dead_left()


RUN = "r1"


def _dead_file(tmp_path, entries) -> None:
    (tmp_path / f"999999999-1{SUFFIX}").write_text(json.dumps(entries))


def test_rows_handed_to_a_task_whose_process_died_are_claimed_by_its_retry_only(tmp_path):
    """The retry of a task has the same slice; rows its first attempt had are counted there once,
    and not by the group's collection, which would count them also when the task had succeeded."""
    dead = Unreported(tmp_path)
    first = dead.committing(0, -1, 10, 10)
    dead.committing(1, -1, 4, 4)  # committed, not yet taken by a slice
    dead.handed([first], SliceId(RUN, 5, 0))
    _dead_file(tmp_path, json.loads(dead.path.read_text()))
    dead.path.unlink()

    member = Unreported(tmp_path)
    assert member.collect(lambda _parts: {0: 10, 1: 4}) == [(1, -1, 4, 4)], "only what no slice took"
    assert member.slice_started(SliceId(RUN, 5, 1)) == [], "another task of the batch"
    assert member.slice_started(SliceId(RUN, 5, 0)) == [(0, -1, 10, 10)]
    assert not (tmp_path / f"999999999-1{SUFFIX}").exists()
    # This attempt holds them in turn: were its process to die too, the next attempt finds them.
    assert [entry[:5] for entry in json.loads(member.path.read_text())] == [[0, -1, 10, 10, SliceId(RUN, 5, 0).text()]]
    assert member.slice_started(SliceId(RUN, 6, 0)) == [], "its task ended: Spark has them"
    assert not member.path.exists()


def test_rows_handed_to_a_task_of_an_earlier_batch_are_dropped(tmp_path):
    """That task succeeded (its batch is over): Spark has its rows, whenever its process died."""
    done = SliceId(RUN, 5, 0).text()
    _dead_file(tmp_path, [[0, -1, 10, 10, done, 1e12]])
    member = Unreported(tmp_path)
    assert member.slice_started(SliceId(RUN, 6, 0)) == []
    assert not (tmp_path / f"999999999-1{SUFFIX}").exists()


def test_rows_handed_long_ago_are_dropped_by_the_collection(tmp_path):
    stale = [0, -1, 10, 10, SliceId("other", 5, 0).text(), time.time() - HANDED_KEPT_S - 1]
    fresh = [0, 10, 12, 2, SliceId("other", 5, 1).text(), time.time()]
    _dead_file(tmp_path, [stale, fresh])
    member = Unreported(tmp_path)
    assert member.collect(lambda _parts: {0: 12}) == []
    assert json.loads((tmp_path / f"999999999-1{SUFFIX}").read_text()) == [fresh], "the fresh one waits for its retry"
