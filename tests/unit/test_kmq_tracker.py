"""The kmq tracker's state: the deliveries its markers leave open, when each is due, where a restart reads
from, how a call to Kafka that fails is tried again while the worker stays up, and how a consumer that
stays broken is replaced."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from queueplane.run.kmq import markers as km
from queueplane.run.kmq import tracker as tracker_module
from queueplane.run.kmq.redeliverer import GIVE_UP, REDELIVER
from queueplane.run.kmq.tracker import RETRY_MAX_S, Faults, OpenDeliveries, Tracker

LOCK_MS, LIMIT = 1000, 3


def fold(deliveries: OpenDeliveries, *markers: km.Marker, partition: int = 0, first_offset: int = 0) -> None:
    """The markers as placed one after another in a markers partition, a record each."""
    for i, m in enumerate(markers):
        run = km.MarkerRun(m.partition, m.kind, m.delivery_count, m.at_ms, m.delay_ms, [m.offset])
        deliveries.fold_run(run, partition, first_offset + i)


def due(deliveries: OpenDeliveries, now_ms: int) -> list[tuple[int, int, int, str]]:
    return [(e.partition, e.offset, e.delivery_count, e.action) for e in deliveries.due(now_ms)]


def test_markers_fold_into_what_each_delivery_is_after_them():
    deliveries = OpenDeliveries(LOCK_MS, LIMIT)
    fold(
        deliveries,
        km.Marker(0, 1, km.START, 1, 100),
        km.Marker(0, 2, km.START, 1, 100),
        km.Marker(0, 1, km.END, 1, 150),
        km.Marker(0, 3, km.START, 1, 50),
        km.Marker(0, 3, km.RETRY, 2, 200, delay_ms=500),
        km.Marker(0, 4, km.START, 1, 60),
        km.Marker(0, 4, km.END, 1, 210),
        km.Marker(0, 4, km.START, 2, 220),
    )
    assert {key: (d.delivery_count, d.due_ms, d.marker_offset) for key, d in deliveries.open.items()} == {
        (0, 2): (1, 1100, 1),
        (0, 3): (2, 700, 4),  # a retry is due after its backoff, and a restart reads from it
        (0, 4): (2, 1220, 7),  # a retried task starts it again after its end
    }


def test_each_open_delivery_is_due_at_its_own_deadline_and_the_last_allowed_one_goes_to_the_dlq():
    deliveries = OpenDeliveries(LOCK_MS, LIMIT)
    fold(
        deliveries,
        km.Marker(0, 1, km.START, LIMIT, 100),
        km.Marker(0, 2, km.START, 1, 600),
        km.Marker(0, 3, km.RETRY, 2, 700, delay_ms=100),
    )
    assert due(deliveries, 799) == []
    assert due(deliveries, 800) == [(0, 3, 2, REDELIVER)], "a retry is due after its backoff"
    assert due(deliveries, 1100) == [(0, 3, 2, REDELIVER), (0, 1, LIMIT, GIVE_UP)], "oldest deadline first"
    deliveries.ended(deliveries.due(1100))
    assert due(deliveries, 1599) == [], "ended once redelivered: not due again"
    assert due(deliveries, 1600) == [(0, 2, 1, REDELIVER)]


def test_an_end_read_later_closes_the_delivery_and_its_deadline_goes_with_it():
    deliveries = OpenDeliveries(LOCK_MS, LIMIT)
    fold(deliveries, km.Marker(0, 1, km.START, 1, 100), km.Marker(0, 2, km.START, 1, 400))
    fold(deliveries, km.Marker(0, 1, km.END, 1, 500), first_offset=2)
    assert due(deliveries, 1100) == [], "1's deadline went with it"
    assert due(deliveries, 1400) == [(0, 2, 1, REDELIVER)]


def test_a_release_makes_its_open_delivery_due_at_once_and_keeps_it_from_the_dlq():
    """A task whose deadline came before a record's call releases it: no call was tried, so the
    delivery, even the last one allowed, is redelivered and not counted."""
    deliveries = OpenDeliveries(LOCK_MS, LIMIT)
    fold(
        deliveries,
        km.Marker(0, 1, km.START, LIMIT, 100),
        km.Marker(0, 2, km.START, 1, 100),
        km.Marker(0, 1, km.RELEASE, LIMIT, 400),
    )
    assert [(e.offset, e.delivery_count, e.action, e.counted) for e in deliveries.due(400)] == [
        (1, LIMIT, REDELIVER, False)
    ], "due at the release, not at start + lock, and never a dead letter for it"
    later = [(e.offset, e.action, e.counted) for e in deliveries.due(1100)]
    assert later == [(1, REDELIVER, False), (2, REDELIVER, True)]
    assert deliveries.open[(0, 1)].marker_offset == 0, "a restart still reads from its start marker"


def test_a_release_of_a_delivery_no_longer_open_changes_nothing():
    """Read after the tracker timed the delivery out (or after a later delivery's start), it must
    not open it again: that would redeliver the message twice."""
    deliveries = OpenDeliveries(LOCK_MS, LIMIT)
    fold(deliveries, km.Marker(0, 1, km.START, 1, 100), km.Marker(0, 2, km.START, 2, 100))
    deliveries.ended(deliveries.due(1100)[:1])  # 1 timed out and redelivered
    fold(
        deliveries,
        km.Marker(0, 1, km.RELEASE, 1, 1200),
        km.Marker(0, 2, km.RELEASE, 1, 1200),  # about an earlier delivery of 2
        first_offset=2,
    )
    assert (0, 1) not in deliveries.open
    assert deliveries.open[(0, 2)] == (2, 1100, 0, 1, True)


def test_a_restart_reads_each_partition_from_its_oldest_marker_holding_an_open_delivery():
    deliveries = OpenDeliveries(LOCK_MS, LIMIT)
    fold(deliveries, km.Marker(0, 1, km.START, 1, 100), km.Marker(0, 2, km.START, 1, 100), partition=0)
    fold(deliveries, km.Marker(1, 7, km.START, 1, 100), km.Marker(1, 7, km.END, 1, 200), partition=1)
    fold(deliveries, km.Marker(0, 1, km.END, 1, 300), partition=0, first_offset=2)
    positions = {0: 3, 1: 2, 2: 0}
    assert deliveries.restart_points(positions) == {0: 1, 1: 2, 2: 0}, "0 keeps its open start; 1 and 2 read on"
    deliveries.ended(deliveries.due(5000))
    assert deliveries.restart_points(positions) == positions


def test_a_restarted_tracker_rebuilds_the_same_open_deliveries_from_its_restart_point():
    markers = [
        km.Marker(0, 1, km.START, 1, 100),
        km.Marker(0, 2, km.START, 1, 110),
        km.Marker(0, 1, km.END, 1, 150),
        km.Marker(0, 3, km.START, 1, 160),
        km.Marker(0, 2, km.RETRY, 2, 170, delay_ms=300),
        km.Marker(0, 3, km.END, 1, 180),
        km.Marker(0, 4, km.START, 1, 190),
    ]
    before = OpenDeliveries(LOCK_MS, LIMIT)
    fold(before, *markers)
    (point,) = before.restart_points({0: len(markers)}).values()
    after = OpenDeliveries(LOCK_MS, LIMIT)
    fold(after, *markers[point:], first_offset=point)
    assert after.open == before.open


def test_a_marker_record_of_runs_opens_and_ends_each_of_its_offsets():
    starts = [km.Marker(2, offset, km.START, 1, 100) for offset in (5, 6, 7, 9)]
    ends = [km.Marker(2, offset, km.END, 1, 300) for offset in (5, 7)]
    deliveries = OpenDeliveries(LOCK_MS, LIMIT)
    for at, (_partition, key, value) in enumerate(km.records(starts) + km.records(ends)):
        deliveries.fold_run(km.decode_run(key, value), 2, at)
    assert due(deliveries, 1100) == [(2, 6, 1, REDELIVER), (2, 9, 1, REDELIVER)]
    assert deliveries.restart_points({2: 2}) == {2: 0}, "the start record still holds two open deliveries"


def test_a_failing_kafka_call_is_tried_again_after_a_growing_pause_and_says_why_the_worker_is_degraded(caplog):
    faults = Faults("reading the partitions of the markers topic")
    assert faults.due(0.0) and faults.degraded(0.0) is None
    with caplog.at_level(logging.INFO, logger="queueplane.worker"):
        faults.failed(100.0, KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down")))
        assert not faults.due(100.5) and faults.due(101.0), "the first pause is RETRY_FIRST_S"
        faults.failed(101.0, RuntimeError("still down"))
        assert not faults.due(102.5) and faults.due(103.0), "then twice as long"
        for now in range(103, 400, 30):
            faults.failed(float(now), RuntimeError("still down"))
        assert faults.pause_s == RETRY_MAX_S, "never longer than RETRY_MAX_S"
        reason = faults.degraded(400.0)
        assert reason == "kmq tracker: reading the partitions of the markers topic has failed for 300s: still down"
        faults.answered(401.0)
    assert faults.degraded(401.0) is None and faults.due(401.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # The first failure at once, then a line a minute at most: 12 failures from 100 s to 373 s, 5 lines.
    assert len(warnings) == 5, warnings
    assert "broker down" in warnings[0] and "the worker stays up" in warnings[0]
    assert "works again, after 301s" in caplog.records[-1].getMessage()
    faults.failed(500.0, RuntimeError("down again"))
    assert faults.due(501.0), "a new outage starts from the first pause again"


class _Consumer:
    """The tracker's consumer over a markers topic of two partitions with nothing new to read;
    ``broken``, every call fails as librdkafka's did after a broker restart."""

    def __init__(self, broken: bool) -> None:
        self.broken, self.assigned, self.closed = broken, [], False

    def _answer(self) -> None:
        if self.broken:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Broker transport failure"))

    def list_topics(self, topic, timeout):
        self._answer()
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None, 1: None})})

    def committed(self, partitions, timeout):
        self._answer()
        return [TopicPartition(tp.topic, tp.partition, 2) for tp in partitions]

    def incremental_assign(self, partitions):
        self.assigned += [(tp.partition, tp.offset) for tp in partitions]

    def consume(self, count, timeout):
        time.sleep(timeout)
        return []

    def commit(self, offsets, asynchronous):
        self._answer()

    def close(self):
        self.closed = True


def test_a_consumer_whose_calls_keep_failing_is_replaced_by_one_reading_on_from_where_it_was(monkeypatch):
    """The first consumer never answers; the tracker is degraded, then makes a new one, which is
    assigned where the tracker had read to (not the group's older commit) and answers."""
    monkeypatch.setattr(tracker_module, "NEW_CLIENT_AFTER_S", 1.5)
    made = [_Consumer(broken=True), _Consumer(broken=False)]
    given = iter(made)
    tracker = Tracker(
        SimpleNamespace(settings={}),
        "g",
        "q.markers",
        OpenDeliveries(LOCK_MS, LIMIT),
        list,
        print,
        make_consumer=lambda config: next(given),
    )
    tracker.positions = {0: 5, 1: 7}  # read to before its broker went away
    tracker.start()
    try:
        deadline = time.monotonic() + 10
        while not made[1].assigned and time.monotonic() < deadline:
            time.sleep(0.05)
        assert made[0].closed and made[0].assigned == []
        assert made[1].assigned == [(0, 5), (1, 7)], "read on from the positions read to"
        while tracker.degraded() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tracker.degraded() is None and tracker.failure is None
    finally:
        tracker.stop()


def test_a_consumer_that_answers_is_kept(monkeypatch):
    monkeypatch.setattr(tracker_module, "NEW_CLIENT_AFTER_S", 0.5)
    made: list[_Consumer] = []

    def make(config):
        made.append(_Consumer(broken=False))
        return made[-1]

    tracker = Tracker(SimpleNamespace(settings={}), "g", "q.markers", OpenDeliveries(LOCK_MS, LIMIT), list, print, make)
    tracker.start()
    time.sleep(2)
    tracker.stop()
    assert len(made) == 1 and made[0].assigned == [(0, 2), (1, 2)], "from the group's commits, once"
