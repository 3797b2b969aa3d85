"""Big records on every runtime: never refused by the worker's own clients, never lost, never a stall.

A topic may take records above librdkafka's 1 MB default; the worker's producers take what
its topics take. A dead letter the DLQ refuses is parked in the queue's topic, and the
records after it are handled.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from worker_support import make_queue, order, produce, read_all, run_worker, run_worker_logged

from queueplane.run import dead_letters as dlq

pytestmark = pytest.mark.kafka

BIG = 2_000_000  # above librdkafka's 1 MB default, within the topics' limit below
TOPIC_LIMIT = 3_000_000


def _set_limits(kafka, limits: dict[str, int]) -> None:
    admin = AdminClient(dict(kafka.settings))
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry("max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)
            ],
        )
        for topic, limit in limits.items()
    ]
    for future in admin.incremental_alter_configs(resources).values():
        future.result()


def _header(message, name: str) -> str | None:
    return next((v.decode() for k, v in message.headers() or [] if k == name), None)


def _ids(messages) -> list[str]:
    return [json.loads(m.value())["id"] for m in messages]


@pytest.mark.parametrize("group_type", ["share", "consumer", "kmq"])
def test_a_record_above_one_megabyte_within_its_topics_limit_is_accepted_and_its_output_written(
    kafka, tmp_path, group_type
):
    queue = make_queue(tmp_path, kafka, group_type=group_type, delivery_limit=2)
    _set_limits(kafka, {queue.topic: TOPIC_LIMIT, queue.output: TOPIC_LIMIT})
    produce(kafka, queue.topic, [order(i) for i in range(5)])
    producer = Producer({**kafka.settings, "message.max.bytes": TOPIC_LIMIT})  # the team's own, raised
    producer.produce(queue.topic, order(500, mode="huge", size=BIG, pad="x" * BIG), key=b"big")  # 2 MB in, 2 MB out
    assert producer.flush(30) == 0
    produce(kafka, queue.topic, [order(i) for i in range(5, 10)])

    summary = run_worker(queue, kafka, "--until-idle", "5s")

    assert summary["counts"]["accepted"] == 11, summary
    assert summary["counts"].get("dlq", 0) == 0, summary
    outputs = read_all(kafka, queue.output, expect_at_least=11)
    assert [len(m.value()) for m in outputs if len(m.value()) > 1000] == [BIG]
    assert read_all(kafka, queue.dlq, timeout_s=3) == []


@pytest.mark.parametrize("group_type", ["consumer", "kmq", "share"])
def test_a_dead_letter_the_dlq_refuses_is_parked_and_the_records_after_it_are_handled(kafka, tmp_path, group_type):
    """Refused on every try alike, a dead letter that fails its task stalls the partition for good."""
    queue = make_queue(tmp_path, kafka, group_type=group_type, delivery_limit=2, partitions=1)
    _set_limits(kafka, {queue.dlq: 1000})  # the DLQ refuses what follows, as an operator's alter might
    rejected = [order(900 + i, mode="reject", pad="x" * 3000) for i in range(2)]
    produce(kafka, queue.topic, [*[order(i) for i in range(10)], *rejected, *[order(i) for i in range(10, 20)]])

    # Never idle while the DLQ refuses: each parked record comes round again.
    summary, log = run_worker_logged(queue, kafka, "--max-duration", "30s")

    assert summary["counts"]["accepted"] == 20, summary  # the records after the refused ones too
    assert "until the DLQ takes it" in log, log[-3000:]
    assert read_all(kafka, queue.dlq, timeout_s=3) == []
    parked = [m for m in read_all(kafka, queue.topic, timeout_s=3) if _header(m, dlq.HEADER_PARKED) == "1"]
    assert {f"id-{900 + i:06d}" for i in range(2)} <= set(_ids(parked))
    assert {_header(m, dlq.HEADER_ERROR_CLASS) for m in parked} == {"Reject"}

    _set_limits(kafka, {queue.dlq: 1_048_588})  # the DLQ is fixed: the parked records reach it
    again = run_worker(queue, kafka, "--until-idle", "6s")
    assert again["counts"]["dlq"] >= 2, again
    dead = read_all(kafka, queue.dlq, expect_at_least=2)
    assert set(_ids(dead)) == {f"id-{900 + i:06d}" for i in range(2)}
    for message in dead:
        assert _header(message, dlq.HEADER_PARKED) is None
        assert _header(message, dlq.HEADER_ERROR_CLASS) == "Reject"
        assert _header(message, dlq.HEADER_SOURCE_TOPIC) == queue.topic
    handled = [e["id"] for e in queue.events() if e.get("id", "").startswith("id-0009")]
    assert sorted(handled) == sorted(f"id-{900 + i:06d}" for i in range(2)), "a parked record is not handled again"
    outputs = _ids(read_all(kafka, queue.output, expect_at_least=20))
    assert set(outputs) == {f"id-{i:06d}" for i in range(20)}


def test_under_declared_acls_a_share_worker_parks_what_the_dlq_refuses(secure_kafka, tmp_path):
    """The worker's principal has WRITE on its own topic: without it, parking failed too and the
    record was released until the broker archived it at its last delivery."""
    tag = uuid.uuid4().hex[:6]
    worker, producer = secure_kafka.user(f"w{tag}"), secure_kafka.user(f"p{tag}")
    access = {"worker": f"User:w{tag}", "producers": [f"User:p{tag}"]}
    queue = make_queue(tmp_path, secure_kafka.admin, delivery_limit=2, lock="3s", access=access)
    _set_limits(secure_kafka.admin, {queue.dlq: 1000})
    produce(producer, queue.topic, [*[order(i) for i in range(10)], order(900, mode="reject", pad="x" * 3000)])

    summary, log = run_worker_logged(queue, worker, "--max-duration", "25s")

    assert summary["counts"]["accepted"] == 10, summary
    assert "until the DLQ takes it" in log, log[-3000:]
    assert "parking it failed" not in log, log[-3000:]
    parked = [m for m in read_all(secure_kafka.admin, queue.topic, timeout_s=3) if _header(m, dlq.HEADER_PARKED)]
    assert _ids(parked)[:1] == ["id-000900"]


def test_an_exactly_once_consumer_parks_what_the_dlq_refuses_inside_its_transaction(kafka, tmp_path):
    """The refused dead letter aborted the transaction on every try, which failed the task on
    every retry: the partition stalled. The transaction is redone with the record's parked copy
    in place of its dead letter, so outputs, the parked copy and the offsets land together."""
    queue = make_queue(tmp_path, kafka, group_type="consumer", delivery_limit=2, partitions=1, exactly_once=True)
    _set_limits(kafka, {queue.dlq: 1000})
    refused = [f"id-{900 + i:06d}" for i in range(2)]
    rejected = [order(900 + i, mode="reject", pad="x" * 3000) for i in range(2)]
    produce(kafka, queue.topic, [*[order(i) for i in range(10)], *rejected, *[order(i) for i in range(10, 20)]])

    summary, log = run_worker_logged(queue, kafka, "--max-duration", "30s")

    assert summary["counts"]["accepted"] == 20, summary  # the records after the refused ones too
    assert "until the DLQ takes it" in log, log[-3000:]
    outputs = _ids(read_all(kafka, queue.output, expect_at_least=20))  # read_committed
    assert sorted(outputs) == [f"id-{i:06d}" for i in range(20)], "each output once, the redone transaction's too"
    assert read_all(kafka, queue.dlq, timeout_s=3) == []
    parked = [m for m in read_all(kafka, queue.topic, timeout_s=3) if _header(m, dlq.HEADER_PARKED) == "1"]
    assert set(_ids(parked)) == set(refused)
    assert {_header(m, dlq.HEADER_ERROR_CLASS) for m in parked} == {"Reject"}
    assert {_header(m, dlq.HEADER_SOURCE_TOPIC) for m in parked} == {queue.topic}

    _set_limits(kafka, {queue.dlq: 1_048_588})  # the DLQ is fixed: the parked records reach it
    again = run_worker(queue, kafka, "--until-idle", "6s")
    assert again["counts"]["dlq"] == 2, again  # the latest parked copy of each: the older ones are committed past
    dead = read_all(kafka, queue.dlq, expect_at_least=2)
    assert sorted(_ids(dead)) == refused, "each in the DLQ once"
    for message in dead:
        assert _header(message, dlq.HEADER_PARKED) is None
        assert _header(message, dlq.HEADER_ERROR_CLASS) == "Reject"
        assert _header(message, dlq.HEADER_SOURCE_TOPIC) == queue.topic
    handled = [e["id"] for e in queue.events() if e.get("id", "").startswith("id-0009")]
    assert sorted(handled) == refused, "a parked record is not handled again"
    assert sorted(_ids(read_all(kafka, queue.output, expect_at_least=20))) == [f"id-{i:06d}" for i in range(20)]


def test_an_exactly_once_output_the_broker_or_the_client_refuses_turns_its_record_into_a_dead_letter(kafka, tmp_path):
    """Refused outputs in a transaction failed it on every try, as a refused dead letter did: the
    transaction is written again with the record's dead letter in place of its outputs."""
    queue = make_queue(tmp_path, kafka, group_type="consumer", delivery_limit=2, partitions=1, exactly_once=True)
    _set_limits(kafka, {queue.output: 5000})
    # Over the output topic's limit (the broker refuses it), over the producer's (refused before it is sent).
    refused = [order(900, mode="huge", size=20_000), order(901, mode="huge", size=2_000_000)]
    produce(kafka, queue.topic, [*[order(i) for i in range(10)], *refused, *[order(i) for i in range(10, 20)]])

    summary = run_worker(queue, kafka, "--until-idle", "6s")

    assert summary["counts"]["accepted"] == 20 and summary["counts"]["dlq"] == 2, summary
    outputs = _ids(read_all(kafka, queue.output, expect_at_least=20))
    assert sorted(outputs) == [f"id-{i:06d}" for i in range(20)], "each output once, none of the refused"
    dead = read_all(kafka, queue.dlq, expect_at_least=2)
    assert sorted(_ids(dead)) == ["id-000900", "id-000901"], "each in the DLQ once"
    assert {_header(m, dlq.HEADER_ERROR_CLASS) for m in dead} == {"InvalidOutput"}
