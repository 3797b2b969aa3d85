"""A share fetcher, in this process against the real broker: through a poll that fails midway, and
through acknowledgements that do not land."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from confluent_kafka import AcknowledgeType, Message
from worker_support import make_queue, order, produce, read_all

from queueplane.handler_api import Record
from queueplane.kafka import clients
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, each_record
from queueplane.run.share.executor.process import ShareProcess
from queueplane.run.share.settings import ShareSettings
from queueplane.spec.model import SHARE_RESERVE_DELIVERIES

pytestmark = pytest.mark.kafka

LOCK_S = 30  # longer than the test's wait for the record's second delivery


class FailsOnce(ShareProcess):
    """A process whose first decision about a refused record fails (a bug, a full disk): the poll
    it belongs to fails after its records were handled, before they were all acknowledged."""

    failed = False

    def first_attempt(self, record: Record, now_ms: int) -> int:
        if not self.failed:
            self.failed = True
            raise RuntimeError("injected: the poll fails while deciding its records")
        return super().first_attempt(record, now_ms)


def _settings(queue, kafka, name: str, lock_s: int) -> ShareSettings:
    tag = queue.topic.split(".")[0]
    return ShareSettings(
        kafka=dict(kafka.settings),
        queue=name,
        group_id=queue.group,
        dlq_topic=queue.dlq,
        output_topic=queue.output,
        lock_ms=lock_s * 1000,
        delivery_limit=3,
        broker_delivery_limit=3 + SHARE_RESERVE_DELIVERIES,
        handler=f"qp_handler_{tag}:handle",
        search_paths=[str(queue.folder)],
        topic=queue.topic,
        slots=2,
        max_poll_records=50,
    )


def _calls(folder) -> list[dict]:
    return [json.loads(line) for path in (folder / "events").glob("*.jsonl") for line in path.read_text().splitlines()]


def test_a_poll_that_fails_midway_releases_its_records_and_the_fetcher_goes_on(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, delivery_limit=3, partitions=1, lock=f"{LOCK_S}s")
    settings = _settings(queue, kafka, "fails-once", LOCK_S)
    first = [order(i) for i in range(30)] + [order(30, mode="reject")]
    later = [order(i) for i in range(100, 130)]
    produce(kafka, queue.topic, first)
    process = FailsOnce(settings)
    try:
        deadline = time.monotonic() + 90
        while not process.failed and time.monotonic() < deadline:
            process.run_batch()
        assert process.failed, "no poll reached the injected failure"
        produce(kafka, queue.topic, later)  # a fetcher that stopped fetching would never see these
        outputs: set[str] = set()
        while len(outputs) < 60 and time.monotonic() < deadline:
            process.run_batch()
            outputs = {json.loads(m.value())["id"] for m in read_all(kafka, queue.output, timeout_s=1)}
        process.run_batch(final=True)
    finally:
        process.close()

    want = {f"id-{i:06d}" for i in [*range(30), *range(100, 130)]}
    assert outputs == want, f"missing: {sorted(want - outputs)}"
    dead = [json.loads(m.value())["id"] for m in read_all(kafka, queue.dlq, expect_at_least=1)]
    assert Counter(dead) == Counter({"id-000030": 1}), "the refused record, once"
    calls = sorted((call["dc"], call["start"]) for call in _calls(queue.folder) if call["id"] == "id-000030")
    assert [dc for dc, _ in calls] == [1, 2], "released by the failed poll, refused again on its next delivery"
    # Released, not left to its lock: a record the failed poll did not acknowledge came back only
    # when its acquisition lock ran out.
    assert calls[1][1] - calls[0][1] < LOCK_S, calls


class AcceptancesLost:
    """A share consumer whose acceptances of the chosen records do not land on their first three
    deliveries. It hands the broker a RELEASE instead, with its next poll (after the process
    counted the acceptance, as a lost acknowledgement's redelivery comes): the broker takes it as
    it takes a lost acknowledgement whose lock ran out, the record back one delivery higher,
    without the wait. Everything else goes to the real consumer."""

    def __init__(self, consumer, lost: set[int], landed: list[tuple[int, int]]):
        self._consumer = consumer
        self._lost = lost
        self._landed = landed  # (offset, delivery count) of the chosen records' acceptances that landed
        self._held: list[Message] = []

    def acknowledge(self, message: Message, kind: int) -> None:
        if kind == AcknowledgeType.ACCEPT and message.offset() in self._lost:
            if message.delivery_count() <= 3:
                self._held.append(message)
                return
            self._landed.append((message.offset(), message.delivery_count()))
        self._consumer.acknowledge(message, kind)

    def poll(self, timeout: float) -> list[Message]:
        for message in self._held:
            self._consumer.acknowledge(message, AcknowledgeType.RELEASE)
        self._held = []
        return self._consumer.poll(timeout)

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def test_a_record_whose_acceptances_did_not_land_is_accepted_again_without_a_call_and_never_dead_lettered(
    kafka, tmp_path, monkeypatch
):
    """Accepted and counted on its first delivery, it comes back on its second, third and fourth (a
    reserve delivery, past deliveryLimit 3): each is accepted again by the process that accepted
    it, with no handler call, no second row and no dead letter. A record refused on its first
    delivery still goes to the DLQ."""
    queue = make_queue(tmp_path, kafka, delivery_limit=3, partitions=1, lock=f"{LOCK_S}s")
    lost, landed = {3, 7}, []
    real = clients.share_consumer
    monkeypatch.setattr(clients, "share_consumer", lambda *a, **k: AcceptancesLost(real(*a, **k), lost, landed))
    produce(kafka, queue.topic, [order(i) for i in range(10)] + [order(10, mode="reject")])
    process = ShareProcess(_settings(queue, kafka, "acceptances-lost", LOCK_S))
    rows: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 90
        while {offset for offset, _ in landed} != lost and time.monotonic() < deadline:
            for block in process.run_batch():
                rows += [(offset, outcome) for _, offset, _, outcome in each_record(block)]
        for block in process.run_batch(final=True):
            rows += [(offset, outcome) for _, offset, _, outcome in each_record(block)]
    finally:
        process.close()

    assert sorted(landed) == [(3, 4), (7, 4)], "accepted on the reserve delivery, which landed"
    assert sorted(rows) == [*((i, ACCEPTED) for i in range(10)), (10, DEAD_LETTERED)], "one row each"
    calls = Counter(call["offset"] for call in _calls(queue.folder))
    assert calls == Counter(range(11)), "one handler call each, the records of the lost acceptances too"
    outputs = Counter(json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=10))
    assert outputs == Counter(f"id-{i:06d}" for i in range(10)), "each output once"
    dead = [json.loads(m.value())["id"] for m in read_all(kafka, queue.dlq, expect_at_least=1)]
    assert dead == ["id-000010"], "only the refused record in the DLQ"
