"""The records a share process accepted lately (queueplane.run.share.executor.accepted): found again by
partition and offset, only the accepted rows of a block, and forgotten after their time."""

from __future__ import annotations

from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, RELEASED, Outcome, OutcomeColumns, columns_of
from queueplane.run.share.executor.accepted import AcceptedLately


def _block(places: list[tuple[int, int]], outcomes: list[str] | None = None) -> OutcomeColumns:
    """The rows a fetcher hands over for these records (the accepted in runs)."""
    outcomes = outcomes or [ACCEPTED] * len(places)
    return columns_of(
        [Outcome("t", p, o, None, 1, outcome, None, 1.0, 1) for (p, o), outcome in zip(places, outcomes, strict=True)]
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_records_of_runs_are_found_and_none_around_them():
    accepted = AcceptedLately(60)
    accepted.note([_block([(0, 7), (0, 5), (0, 6), (0, 8)]), _block([(1, 9), (1, 5), (1, 6), (1, 8)])])
    asked = [(0, 4), (0, 5), (0, 8), (0, 9), (1, 5), (1, 6), (1, 7), (1, 8), (1, 9), (1, 10)]
    assert accepted.find(asked) == {1, 2, 4, 5, 7, 8}


def test_a_redelivered_record_is_found_by_partition_and_offset():
    accepted = AcceptedLately(60)
    accepted.note([_block([(0, o) for o in range(100, 200)]), _block([(1, 5), (1, 9)])])
    accepted.note([_block([(0, o) for o in range(200, 250)])])  # the next poll: one run longer
    accepted.note([_block([(0, o) for o in range(10, 20)])])  # an older run noted later
    asked = [(0, 99), (0, 100), (0, 249), (0, 250), (1, 5), (1, 6), (1, 9), (2, 5), (0, 15), (0, 20)]
    assert accepted.find(asked) == {1, 2, 4, 6, 8}


def test_only_accepted_rows_are_remembered():
    accepted = AcceptedLately(60)
    accepted.note([_block([(0, 1), (0, 2), (0, 3), (0, 4)], [ACCEPTED, DEAD_LETTERED, RELEASED, ACCEPTED])])
    assert accepted.find([(0, 1), (0, 2), (0, 3), (0, 4)]) == {0, 3}
    accepted.note([_block([(0, 8)], [RELEASED])])
    assert accepted.find([(0, 8)]) == set()


def test_a_record_is_remembered_for_keep_s_at_least_and_twice_that_at_most():
    clock = Clock()
    accepted = AcceptedLately(60, clock=clock)
    accepted.note([_block([(0, 1)])])
    clock.now += 59
    accepted.note([_block([(0, 2)])])
    clock.now += 2  # a new generation: both still found
    assert accepted.find([(0, 1), (0, 2)]) == {0, 1}
    clock.now += 58  # 119 s after the first, 60 after the second
    assert accepted.find([(0, 1), (0, 2)]) == {0, 1}
    clock.now += 2  # the first generation dropped, with both
    assert accepted.find([(0, 1), (0, 2)]) == set()


def test_after_a_long_quiet_nothing_old_is_found():
    clock = Clock()
    accepted = AcceptedLately(60, clock=clock)
    accepted.note([_block([(0, 1)])])
    clock.now += 500
    assert accepted.find([(0, 1)]) == set()
    accepted.note([_block([(0, 2)])])
    assert accepted.find([(0, 1), (0, 2)]) == {1}
