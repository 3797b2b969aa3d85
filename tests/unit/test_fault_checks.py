"""The fault tests' checks: key order with replays, and duplicates bounded by what was in flight."""

from __future__ import annotations

import random

import pytest
from fault_checks import duplicate_excess, in_flight, key_order_violation, key_order_violations

IN_ORDER = [
    [],
    [7],
    [1, 4, 9, 30],
    [1, 1, 1, 4, 9, 9],  # retries in place
    [1, 4, 9, 4, 9, 12],  # a replay of the suffix from 4, then on
    [1, 4, 9, 1, 4, 9],  # a replay of everything, the last calls
    [1, 4, 9, 9, 12],  # a replay of the last offset alone
    [1, 4, 9, 4, 4, 9, 12],  # a replay whose first record is retried in place
    [1, 4, 9, 12, 4, 9, 9, 12, 20, 12, 20, 25],  # two faults, two replays
    [1, 4, 9, 12, 9, 4, 9, 12, 15],  # a replay cut short by another replay
]


@pytest.mark.parametrize("offsets", IN_ORDER)
def test_offsets_in_order_or_replayed_as_a_suffix_keep_key_order(offsets):
    assert key_order_violation(offsets) is None


BROKEN = [
    ([1, 9, 4], "offset 4 handled for the first time after offset 9"),
    ([1, 4, 9, 4, 12], "the replay from offset 4 skipped offset 9 for 12"),
    ([1, 4, 9, 1, 9, 12], "the replay from offset 1 skipped offset 4 for 9"),
    ([1, 4, 9, 4], "the replay from offset 4 ended before offset 9"),
    ([1, 4, 9, 5], "offset 5 handled for the first time after offset 9"),  # back to a new offset
    ([1, 4, 9, 4, 2, 9], "offset 2 handled for the first time after offset 9"),
]


@pytest.mark.parametrize(("offsets", "why"), BROKEN)
def test_a_new_offset_below_one_handled_or_a_replay_that_is_not_a_whole_suffix_breaks_key_order(offsets, why):
    assert key_order_violation(offsets) == why


def test_every_shuffle_of_a_key_s_offsets_that_is_not_sorted_is_found():
    rng = random.Random(54)
    offsets = list(range(0, 400, 3))
    for _ in range(200):
        shuffled = offsets[:]
        rng.shuffle(shuffled)
        assert key_order_violation(shuffled) is not None
    swapped = offsets[:]
    swapped[10], swapped[11] = swapped[11], swapped[10]
    assert key_order_violation(swapped) is not None


def _call(key, partition, offset, start, record_id=None):
    return {"key": key, "partition": partition, "offset": offset, "start": start, "id": record_id}


def test_calls_are_ordered_by_when_they_began_and_checked_per_key_and_partition():
    calls = [
        _call("a", 0, 5, 2.0),
        _call("a", 0, 1, 1.0),
        _call("b", 0, 3, 1.5),
        _call("a", 1, 9, 0.5),  # another partition: its own sequence
        _call("a", 1, 2, 3.0),
        _call("b", 0, 3, 1.5),  # a hung call's two lines
    ]
    assert key_order_violations(calls) == [
        "key 'a' of partition 1: offset 2 handled for the first time after offset 9 (offsets in call order: [9, 2])"
    ]
    assert key_order_violations(calls[:4]) == []


def _handled(offset, start, partition=0):
    return {"id": f"id-{partition}-{offset}", "partition": partition, "offset": offset, "start": start}


def test_in_flight_are_records_handled_before_a_fault_ended_at_or_past_the_progress_read_as_it_began():
    calls = [
        _handled(0, 1.0),
        _handled(1, 2.0),  # at the progress, handled before the fault: caught
        _handled(2, 12.0),  # handled during the fault: caught
        _handled(3, 25.0),  # handled after the fault ended: not caught
        _handled(5, 3.0, partition=1),  # past partition 1's progress
        _handled(4, 3.0, partition=1),  # behind it: recorded as done
        {"id": None, "partition": 0, "offset": 6, "start": 4.0},  # names no record
    ]
    fault = ({0: 1, 1: 5}, 20.0)
    assert in_flight(calls, [fault]) == {"id-0-1", "id-0-2", "id-1-5"}
    assert in_flight(calls, [fault, ({0: 3, 1: 5}, 30.0)]) == {"id-0-1", "id-0-2", "id-0-3", "id-1-5"}
    assert in_flight(calls, [({}, 0.5)]) == set()  # nothing begun before it ended


def test_duplicates_up_to_the_records_in_flight_pass_and_one_more_fails_naming_the_bound():
    outputs = ["a", "b", "b", "c", "c"]
    assert duplicate_excess(outputs, {"b", "c"}) is None
    assert duplicate_excess([*outputs, "a"], {"b", "c"}) == (
        "3 duplicate outputs, above the 2 records in flight at the faults; "
        "3 records duplicated, 1 of them not in flight, e.g. ['a']"
    )
    assert duplicate_excess(outputs, set()) is not None
