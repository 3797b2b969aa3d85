"""The consumer-group worker on real Spark (its built-in Kafka source) against the real broker."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

import pytest
from worker_support import make_queue, order, produce, read_all, run_worker

from queueplane import dlq
from queueplane.worker.ordering import key_slot

pytestmark = pytest.mark.kafka


def _overlap_peak(events: list[dict]) -> int:
    points = sorted(
        itertools.chain.from_iterable(((e["start"], 1), (e["end"], -1)) for e in events), key=lambda p: (p[0], p[1])
    )
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


def test_key_ordering_keeps_each_keys_offset_order_while_keys_run_in_parallel(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering="key", partitions=2, concurrency=8)
    total, keys = 1200, 32
    produce(
        kafka,
        queue.topic,
        [order(i, random_ms=5) for i in range(total)],
        keys=[f"key-{i % keys:02d}".encode() for i in range(total)],
    )
    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == total and summary["counts"]["dlq"] == 0
    assert summary["lag_at_exit"] == 0

    events = queue.events()
    assert len(events) == total and all(e["dc"] == 1 for e in events)
    by_key = defaultdict(list)
    for e in events:
        by_key[e["key"]].append(e)
    assert len(by_key) == keys
    for key, calls in by_key.items():
        calls.sort(key=lambda e: e["start"])
        offsets = [e["offset"] for e in calls]
        assert offsets == sorted(offsets), f"{key} handled out of offset order"
        for earlier, later in itertools.pairwise(calls):
            assert earlier["end"] <= later["start"], f"two records of {key} ran at once"
    by_partition = defaultdict(list)
    for e in events:
        by_partition[e["partition"]].append(e)
    # Different keys of one partition overlap in time: the key slots, not the partitions, bound parallelism.
    assert max(_overlap_peak(calls) for calls in by_partition.values()) >= 4
    outputs = [json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total)]
    assert sorted(outputs) == sorted(f"id-{i:06d}" for i in range(total))
