"""The kmq markers' format and the headers of a redelivery, without a broker."""

from __future__ import annotations

import pytest

from queueplane.run import dead_letters as dlq
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.executor.resume import ResumePoint, commit_metadata, markers_start


def test_a_marker_survives_encoding_and_reads_as_plain_text():
    marker = km.Marker(3, 120045, km.RETRY, 2, 1_732_000_000_123, 400)
    ((partition, key, value),) = km.records([marker])
    assert (partition, key, value) == (3, b"3:120045", b"retry 2 1732000000123 400")
    assert km.decode(key, value) == [marker]


def test_markers_alike_travel_as_one_record_of_offset_runs_and_read_back_as_they_were():
    starts = [km.Marker(1, offset, km.START, 1, 500) for offset in (*range(100, 110), 112, 120, 121)]
    again = [km.Marker(1, 111, km.START, 2, 500), km.Marker(0, 7, km.START, 1, 500)]
    made = km.records([*starts, *again])
    assert [(p, k, v) for p, k, v in made if k == b"1:100"] == [(1, b"1:100", b"start 1 500 0 100-109,112,120-121")]
    assert len(made) == 3, "one record per partition, kind, count, time and delay"
    assert sorted(m for _p, key, value in made for m in km.decode(key, value)) == sorted([*starts, *again])


def test_markers_gathered_by_what_they_share_make_the_same_records_whatever_their_order():
    offsets = [121, 100, 112, *range(101, 110), 120]
    made = km.run_records({(1, km.START, 1, 500, 0): offsets, (0, km.END, 2, 500, 30): [7]})
    assert made == [(1, b"1:100", b"start 1 500 0 100-109,112,120-121"), (0, b"0:7", b"end 2 500 30")]


def test_a_run_longer_than_a_record_takes_is_split():
    markers = [km.Marker(0, offset, km.END, 1, 9) for offset in range(0, 4 * km.OFFSETS_PER_RECORD + 1, 2)]
    made = km.records(markers)
    assert len(made) == 2 + 1
    assert [m for _p, key, value in made for m in km.decode(key, value)] == markers


@pytest.mark.parametrize("value", [b"begin 1 5 0", b"start 1 5", b"start 1 5 0 3-4 x", b"start 1 5 0 3-x"])
def test_a_record_that_is_not_a_marker_is_an_error(value):
    with pytest.raises(ValueError):
        km.decode(b"0:1", value)


def test_a_redelivery_counts_up_and_points_at_the_message_as_first_produced():
    original = (("trace", b"abc"), (dlq.HEADER_ERROR_CLASS, b"Old"))
    assert km.delivery_count(original) == 1
    where = km.origin(original, "jobs", 1, 70)
    assert where == km.Origin("jobs", 1, 70, None)

    second = km.redelivery_headers(original, where, 2, 1000)
    assert ("trace", b"abc") in second and all(k != dlq.HEADER_ERROR_CLASS for k, _ in second)
    assert km.delivery_count(second) == 2
    # The copy lives at another offset; its origin stays the first one.
    assert km.origin(second, "jobs", 0, 9000) == km.Origin("jobs", 1, 70, 1000)
    third = km.redelivery_headers(second, km.origin(second, "jobs", 0, 9000), 3, 1000)
    assert km.delivery_count(third) == 3 and sum(1 for k, _ in third if k == dlq.HEADER_DELIVERY_COUNT) == 1


def test_a_resume_point_skips_started_records_and_those_below_the_commit():
    point = ResumePoint({0: 100, 1: 7}, {0: frozenset({100, 101, 102, 105, 200})})
    assert [o for o in range(95, 210) if point.skips(0, o)] == [95, 96, 97, 98, 99, 100, 101, 102, 105, 200]
    assert point.skips(1, 6) and not point.skips(1, 7) and not point.skips(2, 0)  # no commit: nothing skipped


def test_a_commit_below_a_record_another_member_started_names_where_that_start_marker_can_be_found():
    # The member found 100-102 and 105 started when its scan of markers partition 0 began at 40.
    point = ResumePoint({0: 100}, {0: frozenset({100, 101, 102, 105})}, since={0: 40})
    # Its tasks' own start markers began at 900: a commit at 103 would hide 105's older marker.
    assert point.markers_from(0, 103, 900) == 40
    assert point.markers_from(0, 105, 900) == 40
    # Past the last record it found started, its own markers are the next owner's start.
    assert point.markers_from(0, 106, 900) == 900
    assert point.markers_from(1, 0, 900) == 900  # a partition with no scan
    given = ResumePoint().replaced([0], point).replaced([1], ResumePoint({1: 3}, since={1: 7}))
    assert given.markers_from(0, 103, 900) == 40 and given.since == {0: 40, 1: 7}


def test_commit_metadata_names_the_markers_end_and_anything_else_reads_as_unknown():
    assert markers_start(commit_metadata(4711)) == 4711
    assert markers_start("") is None and markers_start(None) is None and markers_start("markers@x") is None
