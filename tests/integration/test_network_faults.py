"""Network faults between the worker and its broker, through a real fault proxy (Toxiproxy):
responses slowed, connections reset, connections stalled, while records keep arriving.
Every runtime; nothing lost, duplicates counted (exactlyOnce: none visible).

The broker here is the test's own, with a listener that advertises the proxy's port: the
worker bootstraps at the proxy and every connection it makes passes through it. Set-up
(topics, producing, reading back) talks to the broker directly.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from worker_support import make_queue, order, produce, read_all, start_worker

from queueplane.kafka.target import KafkaTarget
from queueplane.local.fault_proxy import FaultProxy
from queueplane.local.processes import free_port
from queueplane.local.stack import HOST, LocalStack

pytestmark = pytest.mark.kafka

RATE, PRODUCE_S = 50, 70  # records a second, arriving while the faults come and go
TOTAL = RATE * PRODUCE_S
# (toxic, attributes, seconds): ~400 ms more per response; every connection reset as it opens;
# every connection stalled (no data either way, nothing closed) until healed.
FAULTS = (
    ("latency", {"latency": 400, "jitter": 100}, 10),
    ("reset_peer", {"timeout": 0}, 8),
    ("timeout", {"timeout": 0}, 8),
)


@pytest.fixture(scope="module")
def proxied_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FaultProxy, KafkaTarget, KafkaTarget]]:
    proxy_port = free_port(HOST)
    stack = LocalStack(tmp_path_factory.mktemp("proxied-broker") / "local", proxied_at=proxy_port)
    state = stack.up()
    try:
        with FaultProxy(stack.directory / "toxiproxy.log") as faults:
            faults.proxy("broker", proxy_port, stack.proxied_listener_port())
            direct = KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
            behind = f"{HOST}:{proxy_port}"
            yield faults, direct, KafkaTarget({"bootstrap.servers": behind}, behind)
    finally:
        stack.down(purge=True)


def _produce_steadily(kafka: KafkaTarget, topic: str, done: threading.Event) -> None:
    for second in range(PRODUCE_S):
        produce(kafka, topic, [order(second * RATE + i, sleep_ms=5) for i in range(RATE)])
        time.sleep(1)
    done.set()


@pytest.mark.parametrize("group_type", ["share", "consumer", "consumer-exactly-once", "kmq"])
def test_slow_reset_and_stalled_connections_lose_nothing(proxied_broker, tmp_path, group_type, record_property):
    faults, direct, behind = proxied_broker
    kind, exactly_once = group_type.removesuffix("-exactly-once"), group_type.endswith("-exactly-once")
    queue = make_queue(
        tmp_path, direct, group_type=kind, exactly_once=exactly_once, partitions=3, concurrency=8, lock="5s"
    )
    log = tmp_path / "worker.log"
    worker = start_worker(queue, behind, "--until-idle", "8s", log=log)
    produced = threading.Event()
    producer = threading.Thread(target=_produce_steadily, args=(direct, queue.topic, produced), daemon=True)
    producer.start()
    deadline = time.monotonic() + 180
    while sum(1 for e in queue.events() if e.get("result") == "ok") < RATE * 3:  # the worker is under way
        assert time.monotonic() < deadline and worker.poll() is None, log.read_text()[-3000:]
        time.sleep(0.3)
    faulted_at = time.monotonic()
    for kind_of_fault, attributes, seconds in FAULTS:
        assert not produced.is_set(), f"records were still arriving when {kind_of_fault} began"
        faults.toxic("broker", kind_of_fault, kind_of_fault, **attributes)
        time.sleep(seconds)
        faults.heal("broker", kind_of_fault)
        time.sleep(3)
    producer.join(120)

    code = worker.wait(600)
    recovered_s = time.monotonic() - faulted_at
    assert code == 0, log.read_text()[-3000:]
    summary = json.loads(worker.stdout.read())
    outputs = [json.loads(m.value())["id"] for m in read_all(direct, queue.output, expect_at_least=TOTAL, timeout_s=60)]
    missing = {f"id-{i:06d}" for i in range(TOTAL)} - set(outputs)
    assert not missing, f"{len(missing)} records never accepted, e.g. {sorted(missing)[:5]}"
    assert read_all(direct, queue.dlq, timeout_s=3) == [], "every record is valid: none belongs in the DLQ"
    duplicates = len(outputs) - len(set(outputs))
    if exactly_once:
        assert duplicates == 0, "read_committed readers see each output once"
    assert summary["lag_at_exit"] == 0
    record_property(f"network_faults_{group_type}", {"duplicates": duplicates, "s": round(recovered_s)})
    print(
        f"\n{group_type}, latency/reset/stall: {duplicates} duplicates, done {recovered_s:.0f}s after the first fault"
    )
