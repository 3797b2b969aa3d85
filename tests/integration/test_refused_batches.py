"""A record batch the broker refuses for one record's size: only that record is refused.

The broker checks a topic's max.message.bytes per record batch, and librdkafka reports every
record of a refused batch refused. The worker's producers keep their batches within the limits
they read at start, but a handler may write to a topic of its own choosing, whose limit they do
not know (so may a limit lowered since, or one the worker could not read): small outputs then
share the batch of one too big for the topic. Each runtime writes such a suspect again alone
before it turns its record into a dead letter.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from worker_support import make_queue, order, produce, read_all, run_worker

from queueplane.run import dead_letters as dlq

pytestmark = pytest.mark.kafka

SIDE_LIMIT = 5000  # the max.message.bytes of the topic the handler writes to
NEIGHBOURS = 40  # small records before and after the big one, their outputs batched with its


def _side_topic(kafka) -> str:
    topic = f"side-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(dict(kafka.settings))
    config = {"max.message.bytes": str(SIDE_LIMIT)}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result()
    return topic


def _ids(messages) -> list[str]:
    return [json.loads(m.value())["id"] for m in messages]


@pytest.mark.parametrize("group_type", ["consumer", "share", "kmq"])
def test_a_small_output_batched_with_one_too_big_for_its_topic_is_written_not_dead_lettered(
    kafka, tmp_path, group_type
):
    queue = make_queue(tmp_path, kafka, group_type=group_type, partitions=1, delivery_limit=2)
    side = _side_topic(kafka)
    small = [order(i, to=side) for i in range(2 * NEIGHBOURS)]
    big = order(900, mode="huge", size=4 * SIDE_LIMIT, to=side)  # over the side topic's limit
    produce(kafka, queue.topic, [*small[:NEIGHBOURS], big, *small[NEIGHBOURS:]])

    summary = run_worker(queue, kafka, "--until-idle", "6s")

    dead = read_all(kafka, queue.dlq, expect_at_least=1, timeout_s=10)
    assert _ids(dead) == ["id-000900"], "only the big one's record is a dead letter"
    assert [m.headers() and dict(m.headers()).get(dlq.HEADER_ERROR_CLASS) for m in dead] == [b"InvalidOutput"]
    written = _ids(read_all(kafka, side, expect_at_least=2 * NEIGHBOURS))
    assert sorted(written) == [f"id-{i:06d}" for i in range(2 * NEIGHBOURS)], "every small output once"
    assert summary["counts"]["accepted"] == 2 * NEIGHBOURS and summary["counts"]["dlq"] == 1, summary
