"""A DLQ takes every record its queue's topic took: apply keeps its max.message.bytes above the queue's.

A dead letter is its record plus the DLQ headers; a DLQ no larger than its queue's topic
refuses the largest records' dead letters, on every delivery.
"""

from __future__ import annotations

from specs_factory import dump, spec

from queueplane.kafka.cluster import LiveConfig, LiveState, LiveTopic
from queueplane.kafka.owners import Owner
from queueplane.provision.plan import DEAD_LETTER_HEADROOM, desired_state, diff
from queueplane.spec.rules import check_text

DLQ = "brew.orders.v1.dlq"


def _queue(doc):
    return check_text(dump(doc)).raise_if_invalid()[0]


def _state(**kw) -> LiveState:
    base = {"cluster_id": "c", "broker_ids": [1], "broker_configs": {}, "group_config_names": frozenset()}
    base.update(kw)
    return LiveState(**base)


def _dlq_limit(queue, live=None) -> int:
    (dlq,) = [t for t in desired_state([queue], live)[0] if t.role == "dead-letter"]
    return int(dlq.config["max.message.bytes"])


def test_the_dlq_takes_the_queue_topics_limit_from_the_spec_plus_the_dlq_headers():
    doc = spec("share")
    doc["spec"]["topic"]["config"]["max.message.bytes"] = "5000000"
    queue = _queue(doc)
    assert _dlq_limit(queue) == 5_000_000 + DEAD_LETTER_HEADROOM
    created = [c for c in diff([queue], _state(), "t").changes if c.target == DLQ and c.kind == "topic"]
    assert f"max.message.bytes={5_000_000 + DEAD_LETTER_HEADROOM}" in created[0].new


def test_without_a_spec_value_the_live_limit_counts_the_topics_own_before_the_brokers():
    queue = _queue(spec("share"))
    broker = _state(broker_configs={"message.max.bytes": "2000000"})
    assert _dlq_limit(queue, broker) == 2_000_000 + DEAD_LETTER_HEADROOM
    topic = _state(
        broker_configs={"message.max.bytes": "2000000"},
        topic_configs={"brew.orders.v1": {"max.message.bytes": LiveConfig("3000000", True)}},
    )
    assert _dlq_limit(queue, topic) == 3_000_000 + DEAD_LETTER_HEADROOM
    assert _dlq_limit(queue) == 1_048_588 + DEAD_LETTER_HEADROOM  # Kafka's default, nothing known


def test_a_dlq_spec_asking_for_less_is_raised_and_one_asking_for_more_keeps_its_own():
    doc = spec("share")
    doc["spec"]["deadLetter"]["config"] = {"max.message.bytes": "1000", "retention.ms": "1000"}
    low = desired_state([_queue(doc)])[0]
    (dlq,) = [t for t in low if t.role == "dead-letter"]
    assert dlq.config == {"max.message.bytes": str(1_048_588 + DEAD_LETTER_HEADROOM), "retention.ms": "1000"}
    doc["spec"]["deadLetter"]["config"] = {"max.message.bytes": "20000000"}
    assert _dlq_limit(_queue(doc)) == 20_000_000


def test_a_live_dlq_below_its_queue_is_raised_by_the_plan():
    doc = spec("share")
    doc["spec"]["topic"]["config"]["max.message.bytes"] = "3000000"
    queue = _queue(doc)
    topics, _ = desired_state([queue])
    live = _state(
        topics={t.name: LiveTopic(t.partitions, 1) for t in topics},
        owners={t.name: Owner(t.queue, t.spec, t.role) for t in topics if t.managed},
        topic_configs={
            "brew.orders.v1": {
                "max.message.bytes": LiveConfig("3000000", True),
                "retention.ms": LiveConfig("604800000", True),
            },
            DLQ: {"max.message.bytes": LiveConfig("1000", True)},  # altered behind the spec's back
        },
    )
    (change,) = [c for c in diff([queue], live, "t").changes if c.kind == "topic-config"]
    assert (change.target, change.field, change.old) == (DLQ, "max.message.bytes", "1000")
    assert change.new == str(3_000_000 + DEAD_LETTER_HEADROOM)
