"""The kmq tracker with its broker stopped: nothing is ended unread, and the tracker rides it out.

The tracker's sink fetches each expired record by offset, produces it again (or to the DLQ),
then ends the expired delivery with an END marker. A fetch that gets no answer must fail the
batch before any END marker: an END for a record it could not read would close a delivery that
was never redelivered, and the record would be in neither the queue nor the DLQ.

The tracker itself asks the broker for the markers topic's partitions, for where they end when
it starts, and for the records it redelivers: with the broker away each of those fails, and the
tracker must go on (degraded, saying why) rather than stop, which would end the worker.
"""

from __future__ import annotations

import json
import time

import pytest
from helpers import wait_for
from worker_support import idempotent_producer, make_queue, order, produce, read_all

from queueplane.provision import steps
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.redeliverer import REDELIVER, Expired, Redeliverer, TrackerFetchFailed
from queueplane.run.kmq.runtime import GroupCommitter
from queueplane.run.kmq.tracker import OpenDeliveries, Tracker

pytestmark = pytest.mark.kafka

COUNT = 6


def _ends(kafka, topic: str) -> set[tuple[int, int]]:
    messages = read_all(kafka, topic, timeout_s=3)
    markers = [marker for m in messages for marker in km.decode(m.key(), m.value())]
    return {(m.partition, m.offset) for m in markers if m.kind in km.ENDS}


def test_a_tracker_batch_with_its_broker_stopped_ends_nothing_and_redelivers_all_once_it_is_back(
    own_broker, tmp_path, monkeypatch
):
    stack, kafka = own_broker
    queue = make_queue(tmp_path, kafka, group_type="kmq", partitions=2)
    spec = steps.validate([str(queue.spec_path)], None)[0]
    produce(kafka, queue.topic, [order(i) for i in range(COUNT)])
    placed = [(m.partition(), m.offset()) for m in read_all(kafka, queue.topic, expect_at_least=COUNT)]
    expired = [Expired(partition, offset, 1, REDELIVER) for partition, offset in placed]
    monkeypatch.setattr("queueplane.run.kmq.redeliverer.FETCH_TIMEOUT_S", 5.0)  # the production bound is 30 s
    redeliverer = Redeliverer(spec, kafka)
    try:
        stack.down()
        try:
            with pytest.raises(TrackerFetchFailed, match="nothing is ended"):
                redeliverer.handle(expired)
        finally:
            stack.up()
        assert _ends(kafka, spec.markers.name) == set(), "no delivery ended while its record was unread"

        done = redeliverer.handle(expired)  # the batch again, as the restarted tracker runs it
        assert sorted((record.partition, record.offset) for record, _item in done) == sorted(placed)
        assert _ends(kafka, spec.markers.name) == set(placed)
        on_topic = read_all(kafka, queue.topic, expect_at_least=2 * COUNT)
        ids = [json.loads(m.value())["id"] for m in on_topic]
        assert sorted(ids) == sorted(f"id-{i:06d}" for i in range(COUNT) for _copy in range(2))
        redelivered = [m for m in on_topic if km.delivery_count(m.headers() or []) == 2]
        assert len(redelivered) == COUNT, "each record once more, its delivery count raised"
    finally:
        redeliverer.close()


def _write_starts(kafka, topic: str, placed: list[tuple[int, int]]) -> None:
    """A START marker for each record, now: deliveries open until their lock runs out."""
    now_ms = int(time.time() * 1000)
    producer = idempotent_producer(kafka)
    for partition, key, value in km.records(km.Marker(p, o, km.START, 1, now_ms) for p, o in placed):
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def test_the_tracker_rides_out_outages_at_its_start_and_with_deliveries_due_then_redelivers_them(
    own_broker, tmp_path, monkeypatch
):
    """The broker is down when the tracker starts, and again while deliveries fall due: the
    tracker stays up, says why it is degraded, is never idle meanwhile, and redelivers each due
    delivery once the broker is back."""
    stack, kafka = own_broker
    # The markers topic's partitions asked every half second, not every 30 s: during each outage.
    monkeypatch.setattr("queueplane.run.kmq.tracker.METADATA_EVERY_S", 0.5)
    monkeypatch.setattr("queueplane.run.kmq.redeliverer.FETCH_TIMEOUT_S", 3.0)
    queue = make_queue(tmp_path, kafka, group_type="kmq", partitions=2, lock="10s")
    spec = steps.validate([str(queue.spec_path)], None)[0]
    produce(kafka, queue.topic, [order(i) for i in range(COUNT)])
    placed = sorted((m.partition(), m.offset()) for m in read_all(kafka, queue.topic, expect_at_least=COUNT))
    committer, redeliverer = GroupCommitter(spec, kafka), Redeliverer(spec, kafka)
    done: list = []
    deliveries = OpenDeliveries(spec.group.lock_duration_ms, spec.group.delivery_limit)
    tracker = Tracker(kafka, spec.group.id, spec.markers.name, deliveries, redeliverer.handle, done.extend)

    def degraded_by(*what: str):
        """A check: the tracker's reason to be degraded once it names each of ``what``. The
        tracker must never have stopped: that would end the worker."""

        def check():
            assert tracker.failure is None, f"the tracker stopped: {tracker.failure!r}"
            reason = tracker.degraded()
            return reason if reason and all(w in reason for w in what) else None

        return check

    def recovered() -> bool:
        assert tracker.failure is None, f"the tracker stopped: {tracker.failure!r}"
        return tracker.degraded() is None

    try:
        stack.down()
        try:
            tracker.expect_from(committer.markers_ends)
            tracker.start()
            both = ("where the markers partitions end", "partitions of the markers topic")
            wait_for("the tracker to say why it is degraded", degraded_by(*both), 90, 0.5)
            assert not tracker.idle(), "where the markers end is not known: it cannot be idle"
        finally:
            stack.up()
        wait_for("the tracker to recover", recovered, 90, 0.5)

        _write_starts(kafka, spec.markers.name, placed)
        wait_for("the START markers read", lambda: len(deliveries.open) == COUNT, 60, 0.2)
        stack.down()  # the deliveries fall due (10 s lock) while the broker is away
        try:
            wait_for("the redelivery round to fail", degraded_by("redelivering the deliveries due"), 120, 0.5)
            assert done == [] and len(deliveries.open) == COUNT, "nothing ended while the broker was away"
        finally:
            stack.up()

        wait_for("every due delivery redelivered", lambda: recovered() and len(done) == COUNT, 180, 0.5)
        assert sorted((record.partition, record.offset) for record, _item in done) == placed
        assert _ends(kafka, spec.markers.name) == set(placed)
        on_topic = read_all(kafka, queue.topic, expect_at_least=2 * COUNT)
        redelivered = [m for m in on_topic if km.delivery_count(m.headers() or []) == 2]
        assert len(redelivered) == COUNT, "each record once more, its delivery count raised"
        tracker.expect(committer.markers_ends())
        wait_for("the tracker idle", tracker.idle, 60, 0.5)
        assert tracker.failure is None
    finally:
        tracker.stop()
        redeliverer.close()
        committer.close()
