"""The kmq tracker's redelivery with its broker stopped mid-batch: nothing is ended unread.

The tracker's sink fetches each expired record by offset, produces it again (or to the DLQ),
then ends the expired delivery with an END marker. A fetch that gets no answer must fail the
batch before any END marker: an END for a record it could not read would close a delivery that
was never redelivered, and the record would be in neither the queue nor the DLQ.
"""

from __future__ import annotations

import json

import pytest
from worker_support import make_queue, order, produce, read_all

from queueplane.provision import steps
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.redeliverer import REDELIVER, Expired, Redeliverer, TrackerFetchFailed

pytestmark = pytest.mark.kafka

COUNT = 6


def _ends(kafka, topic: str) -> set[tuple[int, int]]:
    messages = read_all(kafka, topic, timeout_s=3)
    markers = [marker for m in messages for marker in km.decode(m.key(), m.value())]
    return {(m.partition, m.offset) for m in markers if m.kind == km.END}


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
