"""Handlers that break the contract, on every runtime: the worker stays up, every other record
is processed, and each bad record ends in the DLQ with an error class that says what happened."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from worker_support import make_queue, order, produce, read_all, run_worker

from queueplane.run import dead_letters as dlq
from queueplane.spec.model import SHARE_RESERVE_DELIVERIES

pytestmark = pytest.mark.kafka

LIMIT = 3
# Long enough that a worker started again after a killer (its Python process, its share session
# or group membership) reaches the next delivery within the lock while other tests load the
# machine: a last delivery whose lock ran out first ends as a Timeout, not as what killed it.
LOCK = "10s"
OUTPUT_MAX_BYTES = 5000
# id → (how the handler misbehaves, the DLQ's error class, the delivery count it ends at)
BAD = {
    "id-000900": ({"mode": "exit"}, "SystemExit", LIMIT),
    "id-000901": ({"mode": "exit"}, "SystemExit", LIMIT),
    "id-000902": ({"mode": "bad_return"}, "InvalidOutput", 1),
    "id-000903": ({"mode": "bad_header"}, "InvalidOutput", 1),
    "id-000904": ({"mode": "unserialisable"}, "InvalidOutput", 1),
    # Over the output topic's max.message.bytes: the broker refuses it after it was sent.
    "id-000905": ({"mode": "huge", "size": 20_000}, "InvalidOutput", 1),
    # Over the producer's own limit (1 MB): refused before it is sent.
    "id-000906": ({"mode": "huge", "size": 2_000_000}, "InvalidOutput", 1),
    # Past lockDuration on every delivery: its thread is given up (and replaced) each time.
    "id-000907": ({"mode": "hang_forever"}, "Timeout", LIMIT),
    # The Python worker process dies with the call (os._exit): Spark starts another.
    "id-000908": ({"mode": "os_exit"}, "WorkerDied", LIMIT),
    # Takes memory until its process passes processing.memoryLimit and ends itself.
    "id-000909": ({"mode": "memory_hog"}, "MemoryLimitExceeded", LIMIT),
}
KILLERS = ("id-000908", "id-000909")
MEMORY_LIMIT = "768m"

BIG_VALUE_BYTES = 5 * 1024 * 1024
BAD_HEADER_KEY = b"\xff\xfe-not-utf-8"


def _header(message, name: str) -> str | None:
    return next((v.decode() for k, v in message.headers() or [] if k == name), None)


@pytest.mark.parametrize("group_type", ["share", "consumer", "kmq"])
def test_misbehaving_handlers_cost_only_their_own_records(kafka, tmp_path, group_type):
    queue = make_queue(
        tmp_path, kafka, group_type=group_type, delivery_limit=LIMIT, lock=LOCK, partitions=2, memory_limit=MEMORY_LIMIT
    )
    admin = AdminClient(dict(kafka.settings))
    small = ConfigResource(
        ResourceType.TOPIC,
        queue.output,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(OUTPUT_MAX_BYTES), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    # The queue takes a 5 MB record, as a team's topic may.
    big = ConfigResource(
        ResourceType.TOPIC,
        queue.topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(2 * BIG_VALUE_BYTES), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([small, big])[small].result()
    good = [order(i) for i in range(40)]
    bad = [order(int(ident[3:]), **fields) for ident, (fields, _, _) in BAD.items()]
    produce(kafka, queue.topic, [*good[:20], *bad, *good[20:]])
    # A hostile but valid record: a header key that is not UTF-8 (Kafka's clients cannot write one
    # from a str; librdkafka takes bytes) and a 5 MB value. The handler accepts it like any other.
    producer = Producer({**kafka.settings, "message.max.bytes": 2 * BIG_VALUE_BYTES})
    producer.produce(
        queue.topic, order(40, pad="x" * BIG_VALUE_BYTES), key=b"big", headers=[(BAD_HEADER_KEY, b"v"), ("ok", b"v")]
    )
    assert producer.flush(30) == 0

    summary = run_worker(queue, kafka, "--until-idle", "10s")  # exit 0: the worker survived them all

    outputs = [json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=41)]
    assert sorted(set(outputs)) == [f"id-{i:06d}" for i in range(41)], "every good record, none of the bad"
    dead = read_all(kafka, queue.dlq, expect_at_least=len(BAD))
    all_by_id: dict[str, list] = {}
    for message in dead:
        all_by_id.setdefault(json.loads(message.value())["id"], []).append(message)
    assert sorted(all_by_id) == sorted(BAD), summary
    # A task whose Python worker died (os._exit) is tried again: what its failed attempt finished
    # is durable and committed, and the retry counts it skipped, so every record is counted once.
    counts = summary["counts"]
    assert counts["accepted"] + counts["dlq"] + counts.get("skipped", 0) == 41 + len(BAD), summary
    # A dead letter written by a task whose process then died is written again by the task's retry
    # (at least once, as outputs are): at most once more per death, and each killer dies LIMIT times.
    twice = {ident: len(messages) for ident, messages in all_by_id.items() if len(messages) > 1}
    assert all(n <= 1 + LIMIT * len(KILLERS) for n in twice.values()), twice
    # A call running when its process died counts as a delivery: a record that was in flight beside
    # the one that killed the process may come one delivery later per death it saw. A share killer
    # whose first death came on its last delivery ends on the reserve delivery.
    for ident, (_, error_class, deliveries) in BAD.items():
        for message in all_by_id[ident]:
            seen = (_header(message, dlq.HEADER_ERROR_CLASS), int(_header(message, dlq.HEADER_DELIVERY_COUNT)))
            why = (ident, seen, _header(message, dlq.HEADER_ERROR_MESSAGE))
            # kmq: the tracker may time the last delivery out before a retried task sees the deaths.
            timed_out = (group_type, seen[0]) == ("kmq", "Timeout") and ident in KILLERS
            # share: every record a dying process held comes back a delivery later, in a call or not
            # (the broker counts it); one whose last delivery went so ends on a reserve delivery.
            lost_last = (
                group_type == "share"
                and seen[0] == "DeliveryLimitReached"
                and LIMIT < seen[1] <= LIMIT + SHARE_RESERVE_DELIVERIES
                and deliveries == LIMIT
            )
            assert seen[0] == error_class or timed_out or lost_last, why
            most = deliveries + (LIMIT if ident not in KILLERS else 1 if group_type == "share" else 0)
            assert deliveries <= seen[1] <= most, why
    by_id = {ident: messages[0] for ident, messages in all_by_id.items()}
    refused = _header(by_id["id-000905"], dlq.HEADER_ERROR_MESSAGE)
    assert "MSG_SIZE_TOO_LARGE" in refused or "too large" in refused.lower()
    assert "int" in _header(by_id["id-000902"], dlq.HEADER_ERROR_MESSAGE)
    if "id-000909" in by_id and _header(by_id["id-000909"], dlq.HEADER_ERROR_CLASS) == "MemoryLimitExceeded":
        assert "over processing.memoryLimit (768 MiB)" in _header(by_id["id-000909"], dlq.HEADER_ERROR_MESSAGE)
