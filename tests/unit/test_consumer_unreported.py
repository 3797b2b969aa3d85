"""Rows a group member committed and never reported: counted by the next member only as far as
the group's committed offsets say they were committed."""

from __future__ import annotations

import json

from queueplane.run.consumer.executor.unreported import SUFFIX, Unreported


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
    member.reported([first])
    assert json.loads(member.path.read_text()) == [[1, -1, 4, 4]]
    member.close()
    assert not member.path.exists()
