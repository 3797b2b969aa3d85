"""Broker outages on every runtime, at start and mid-run: nothing lost.

These tests stop and restart a broker of their own (same data directory, same ports), so the
session's shared broker stays up for every other test.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_support import TestQueue as Queue
from worker_support import make_queue, order, produce, read_all, start_worker

from queueplane.kafka.target import KafkaTarget
from queueplane.local.stack import LocalStack

pytestmark = pytest.mark.kafka

OUTAGE_S = 20
START_OUTAGE_S = 30
TOTAL = 3000
HUNG = 5  # records whose first delivery runs past the lock: redelivered across the outage


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, KafkaTarget]]:
    stack = LocalStack(tmp_path_factory.mktemp("outage-broker") / "local")
    state = stack.up()
    yield stack, KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
    stack.down(purge=True)


def _start(queue: Queue, kafka: KafkaTarget, log: Path) -> subprocess.Popen:
    # A short idle bound: the driver never counts an outage as idle (no batch yet, or no lag it can read).
    return start_worker(queue, kafka, "--until-idle", "8s", log=log)


@pytest.mark.parametrize("group_type", ["share", "consumer", "kmq"])
def test_broker_outages_at_start_and_mid_run_lose_nothing(own_broker, tmp_path, group_type, record_property):
    stack, kafka = own_broker
    queue = make_queue(tmp_path, kafka, group_type=group_type, partitions=3, concurrency=8, lock="4s", delivery_limit=5)
    hung = {f"id-{i:06d}" for i in range(HUNG)}
    values = [order(i, mode="hang", hang_s=8) if i < HUNG else order(i, sleep_ms=2) for i in range(TOTAL)]
    produce(kafka, queue.topic, values)
    log = tmp_path / "worker.log"

    stack.down()  # the worker starts first (a pod scheduled before its broker is back)
    try:
        worker = _start(queue, kafka, log)
        time.sleep(START_OUTAGE_S)
        assert worker.poll() is None, "the worker waits for the broker: " + log.read_text()[-2000:]
    finally:
        stack.up()
    deadline = time.monotonic() + 180
    while sum(1 for e in queue.events() if e.get("result") == "ok") < TOTAL // 5:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        assert worker.poll() is None, log.read_text()[-3000:]
        time.sleep(0.3)
    stack.down()  # mid-run, with hung records locked and the rest in flight
    stopped_at = time.monotonic()
    time.sleep(OUTAGE_S)
    stack.up()
    restarts = 0
    while True:  # what a supervisor does: a worker that gave up is started again
        code = worker.wait(600)
        if code == 0:
            summary = json.loads(worker.stdout.read())
            break
        restarts += 1
        assert restarts <= 2, log.read_text()[-3000:]
        worker = _start(queue, kafka, log)
    recovered_s = time.monotonic() - stopped_at

    outputs = [json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=TOTAL, timeout_s=60)]
    dead = read_all(kafka, queue.dlq, timeout_s=3)
    missing = {f"id-{i:06d}" for i in range(TOTAL)} - set(outputs)
    assert not missing, f"{len(missing)} records never accepted, e.g. {sorted(missing)[:5]}"
    assert dead == [], "every record is valid: none belongs in the DLQ"
    assert hung <= set(outputs)
    duplicates = len(outputs) - len(set(outputs))
    assert summary["lag_at_exit"] == 0
    record_property(f"outage_{group_type}", {"duplicates": duplicates, "restarts": restarts, "s": recovered_s})
    print(f"\n{group_type}, {OUTAGE_S}s outage: {restarts} restarts, {duplicates} duplicates, {recovered_s:.0f}s")
