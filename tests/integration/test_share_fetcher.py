"""A share fetcher, in this process against the real broker, through a poll that fails midway."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from worker_support import make_queue, order, produce, read_all

from queueplane.run.handler import Record
from queueplane.run.share.process import ProcessRuntime
from queueplane.run.share.settings import ShareSettings
from queueplane.spec.model import SHARE_RESERVE_DELIVERIES

pytestmark = pytest.mark.kafka

LOCK_S = 30  # longer than the test's wait for the record's second delivery


class FailsOnce(ProcessRuntime):
    """A process whose first decision about a refused record fails (a bug, a full disk): the poll
    it belongs to fails after its records were handled, before they were all acknowledged."""

    failed = False

    def first_attempt(self, record: Record, now_ms: int) -> int:
        if not self.failed:
            self.failed = True
            raise RuntimeError("injected: the poll fails while deciding its records")
        return super().first_attempt(record, now_ms)


def _calls(folder) -> list[dict]:
    return [json.loads(line) for path in (folder / "events").glob("*.jsonl") for line in path.read_text().splitlines()]


def test_a_poll_that_fails_midway_releases_its_records_and_the_fetcher_goes_on(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, delivery_limit=3, partitions=1, lock=f"{LOCK_S}s")
    tag = queue.topic.split(".")[0]
    settings = ShareSettings(
        kafka=dict(kafka.settings),
        queue="fails-once",
        group_id=queue.group,
        dlq_topic=queue.dlq,
        output_topic=queue.output,
        lock_ms=LOCK_S * 1000,
        delivery_limit=3,
        broker_delivery_limit=3 + SHARE_RESERVE_DELIVERIES,
        handler=f"qp_handler_{tag}:handle",
        search_paths=[str(queue.folder)],
        topic=queue.topic,
        slots=2,
        max_poll_records=50,
    )
    first = [order(i) for i in range(30)] + [order(30, mode="reject")]
    later = [order(i) for i in range(100, 130)]
    produce(kafka, queue.topic, first)
    runtime = FailsOnce(settings)
    try:
        deadline = time.monotonic() + 90
        while not runtime.failed and time.monotonic() < deadline:
            runtime.run_batch()
        assert runtime.failed, "no poll reached the injected failure"
        produce(kafka, queue.topic, later)  # a fetcher that stopped fetching would never see these
        outputs: set[str] = set()
        while len(outputs) < 60 and time.monotonic() < deadline:
            runtime.run_batch()
            outputs = {json.loads(m.value())["id"] for m in read_all(kafka, queue.output, timeout_s=1)}
        runtime.run_batch(final=True)
    finally:
        runtime.close()

    want = {f"id-{i:06d}" for i in [*range(30), *range(100, 130)]}
    assert outputs == want, f"missing: {sorted(want - outputs)}"
    dead = [json.loads(m.value())["id"] for m in read_all(kafka, queue.dlq, expect_at_least=1)]
    assert Counter(dead) == Counter({"id-000030": 1}), "the refused record, once"
    calls = sorted((call["dc"], call["start"]) for call in _calls(queue.folder) if call["id"] == "id-000030")
    assert [dc for dc, _ in calls] == [1, 2], "released by the failed poll, refused again on its next delivery"
    # Released, not left to its lock: a record the failed poll did not acknowledge came back only
    # when its acquisition lock ran out.
    assert calls[1][1] - calls[0][1] < LOCK_S, calls
