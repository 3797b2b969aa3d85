"""Broker outages on every runtime, at start and mid-run: nothing lost.

The test stops and restarts a broker of its own (same data directory, same ports), so the
session's shared broker stays up for every other test.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from worker_support import SteadyLoad, Supervised, make_queue, order, produce, read_all

from queueplane.kafka.target import KafkaTarget
from queueplane.local.stack import LocalStack

pytestmark = [pytest.mark.kafka, pytest.mark.heavy]

OUTAGE_S = 20
START_OUTAGE_S = 30
INITIAL = 1000  # waiting before the workers start
RATE = 30  # then arriving steadily, so the mid-run outage is mid-run for every worker
AFTER_S = 10  # and for a while after it
HUNG = 5  # records whose first delivery runs past the lock: redelivered across the outages
RUNTIMES = ("share", "consumer", "kmq")


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, KafkaTarget]]:
    stack = LocalStack(tmp_path_factory.mktemp("outage-broker") / "local")
    state = stack.up()
    yield stack, KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
    stack.down(purge=True)


def test_broker_outages_at_start_and_mid_run_lose_nothing_on_any_runtime(own_broker, tmp_path, record_property):
    """One worker per runtime on one broker, as teams share a cluster: the broker is down when they
    start (up 30 s later), then stopped for 20 s while records arrive. A worker that gives up is
    started again, as its supervisor (a Deployment) would."""
    stack, kafka = own_broker
    queues, logs = {}, {}
    for runtime in RUNTIMES:
        folder = tmp_path / runtime
        folder.mkdir()
        queues[runtime] = make_queue(
            folder, kafka, group_type=runtime, partitions=3, concurrency=8, lock="4s", delivery_limit=5
        )
        logs[runtime] = folder / "worker.log"
        initial = [order(i, mode="hang", hang_s=8) if i < HUNG else order(i, sleep_ms=2) for i in range(INITIAL)]
        produce(kafka, queues[runtime].topic, initial)

    stack.down()  # the workers start first (pods scheduled before their broker is back)
    try:
        # A short idle bound: the driver never counts an outage as idle (no batch yet, or no lag it can read).
        workers = {
            runtime: Supervised(queue, kafka, "--until-idle", "8s", log=logs[runtime])
            for runtime, queue in queues.items()
        }
        time.sleep(START_OUTAGE_S)
        for runtime, worker in workers.items():
            assert worker.process.poll() is None, (
                f"{runtime} waits for the broker: " + logs[runtime].read_text()[-2000:]
            )
    finally:
        stack.up()
    broker_up = threading.Event()
    broker_up.set()
    load = SteadyLoad(kafka, [q.topic for q in queues.values()], RATE, first_id=INITIAL, gate=broker_up)
    load.start()
    deadline = time.monotonic() + 180
    for runtime, queue in queues.items():
        while sum(1 for e in queue.events() if e.get("result") == "ok") < INITIAL // 2:
            assert time.monotonic() < deadline, logs[runtime].read_text()[-3000:]
            assert workers[runtime].running(), logs[runtime].read_text()[-3000:]
            time.sleep(0.3)
    assert load.is_alive(), "records still arrive when the broker stops"
    broker_up.clear()
    stack.down()  # mid-run, with hung records locked and the rest in flight
    stopped_at = time.monotonic()
    time.sleep(OUTAGE_S)
    stack.up()
    broker_up.set()
    time.sleep(AFTER_S)
    total = INITIAL + load.stop()

    table = {}
    for runtime, queue in queues.items():
        summary = workers[runtime].summary()
        done_s = time.monotonic() - stopped_at
        read = read_all(kafka, queue.output, expect_at_least=total, timeout_s=60)
        outputs = [json.loads(m.value())["id"] for m in read]
        missing = {f"id-{i:06d}" for i in range(total)} - set(outputs)
        assert not missing, f"{runtime}: {len(missing)} records never accepted, e.g. {sorted(missing)[:5]}"
        assert read_all(kafka, queue.dlq, timeout_s=3) == [], f"{runtime}: every record is valid, none in the DLQ"
        assert summary["lag_at_exit"] == 0, runtime
        duplicates = len(outputs) - len(set(outputs))
        table[runtime] = {
            "lost": 0,
            "duplicates": duplicates,
            "restarts": workers[runtime].restarts,
            "done_s": round(done_s),
        }
    record_property("broker_outages", table)
    print(f"\n{START_OUTAGE_S}s down at start, {OUTAGE_S}s mid-run, {total} records per runtime: {table}")
