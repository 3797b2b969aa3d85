"""The kmq tracker's state: one map of open deliveries per queue partition, one timer at its earliest deadline."""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester

from queueplane.run.kmq import markers as km
from queueplane.run.kmq.tracker import GIVE_UP, REDELIVER, fold_markers, tracker_processor

LOCK_MS, LIMIT = 1000, 3


def marker(offset: int, kind: str, at_ms: int, count: int = 1, delay_ms: int = 0) -> Row:
    """A marker row as the tracker's query makes it (markers.SQL_FIELDS and the queue offset)."""
    return Row(
        id=km.message_id(0, offset),
        kind=kind,
        delivery_count=count,
        at_ms=at_ms,
        delay_ms=delay_ms,
        marker_partition=0,
        marker_offset=0,
        queue_partition=0,
        queue_offset=offset,
    )


def in_order(*markers: Row) -> list[Row]:
    """The markers as placed on the markers topic, one after another."""
    return [Row(**{**m.asDict(), "marker_offset": i}) for i, m in enumerate(markers)]


def tracker() -> TwsTester:
    return TwsTester(tracker_processor(LOCK_MS, LIMIT), timeMode="ProcessingTime")


def expired(rows: list[Row]) -> list[tuple[str, int, str]]:
    return [(row.id, row.delivery_count, row.action) for row in rows]


def test_markers_fold_into_what_each_delivery_is_after_them():
    batch = in_order(
        marker(1, km.START, 100),
        marker(2, km.START, 100),
        marker(1, km.END, 150),
        marker(3, km.RETRY, 200, count=2, delay_ms=500),
        marker(4, km.END, 210),
        marker(4, km.START, 220, count=2),
    )
    before = {3: (1, 50, 1050), 4: (1, 60, 1060)}
    assert fold_markers(batch, before, LOCK_MS) == {
        1: None,  # started and ended here
        2: (1, 100, 1100),
        3: (2, 50, 700),  # a retry keeps the start of the delivery before it, due after its backoff
        4: (2, 220, 1220),  # a restart starts it again after its end
    }


def test_a_delivery_ended_in_its_batch_leaves_no_state_and_one_left_open_is_redelivered_at_its_deadline():
    tws = tracker()
    assert tws.test(0, in_order(marker(1, km.START, 100), marker(1, km.END, 120), marker(2, km.START, 130))) == []
    assert tws.peekMapState("open", 0) == {(2,): (1, 130, 1130)}, "only what stays open is stored"
    assert tws.setProcessingTime(1129) == []
    assert expired(tws.setProcessingTime(1130)) == [("0:2", 1, REDELIVER)]
    assert tws.peekMapState("open", 0) == {}
    assert tws.setProcessingTime(5000) == [], "emitted once"


def test_an_end_in_a_later_batch_closes_the_delivery_and_its_deadline_goes_with_it():
    tws = tracker()
    tws.test(0, in_order(marker(1, km.START, 100), marker(2, km.START, 400)))
    tws.test(0, in_order(marker(1, km.END, 500)))
    assert tws.peekMapState("open", 0) == {(2,): (1, 400, 1400)}
    assert tws.setProcessingTime(1100) == [], "1's deadline went with it"
    assert expired(tws.setProcessingTime(1400)) == [("0:2", 1, REDELIVER)]


def test_each_open_delivery_expires_at_its_own_deadline_and_the_last_allowed_one_goes_to_the_dlq():
    tws = tracker()
    tws.test(0, in_order(marker(1, km.START, 100, count=LIMIT), marker(2, km.START, 600)))
    tws.test(0, in_order(marker(3, km.RETRY, 700, count=2, delay_ms=100)))
    assert expired(tws.setProcessingTime(800)) == [("0:3", 2, REDELIVER)], "a retry is due after its backoff"
    assert expired(tws.setProcessingTime(1100)) == [("0:1", LIMIT, GIVE_UP)]
    assert expired(tws.setProcessingTime(1600)) == [("0:2", 1, REDELIVER)]
    assert tws.peekMapState("open", 0) == {}


def test_partitions_keep_their_own_deliveries():
    tws = tracker()
    other = Row(**{**marker(1, km.START, 300).asDict(), "id": km.message_id(1, 1), "queue_partition": 1})
    tws.test(0, in_order(marker(1, km.START, 100)))
    tws.test(1, [other])
    tws.test(0, in_order(marker(1, km.END, 200)))
    assert tws.peekMapState("open", 1) == {(1,): (1, 300, 1300)}
    assert expired(tws.setProcessingTime(2000)) == [("1:1", 1, REDELIVER)]
