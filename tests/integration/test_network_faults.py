"""Network faults between the worker and its broker, through a real fault proxy (Toxiproxy):
responses slowed, connections reset, connections stalled, while records keep arriving.
Every runtime; nothing lost, duplicates within what was in flight as each fault began
(exactlyOnce: none visible; ``fault_checks``), a key-ordered consumer queue's keys in order
(a duplicate only as a replayed suffix), and no worker ends: each rides the faults out (a
restart fails the test).

The broker here is the test's own, with a listener that advertises the proxy's port: the
worker bootstraps at the proxy and every connection it makes passes through it. Set-up
(topics, producing, reading back) talks to the broker directly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from fault_checks import RUNTIMES, FaultLog, duplicate_excess, key_order_violations
from worker_support import (
    FAULT_TESTS_IN_FLIGHT,
    SteadyLoad,
    Supervised,
    make_queue,
    order,
    produce,
    read_all,
    recovered_after,
)

from queueplane.kafka.target import KafkaTarget
from queueplane.local.fault_proxy import FaultProxy
from queueplane.local.processes import free_port
from queueplane.local.stack import HOST, LocalStack

pytestmark = [pytest.mark.kafka, pytest.mark.heavy(paired=True)]

RATE = 50  # records a second to each queue, arriving from before the faults until after them
# And a burst to each queue as the first fault begins: in flight through it. Trivial records, so
# a share worker's polls (whole producer batches) end within the lock however large they are.
BURST = 20_000
BURST_FIRST_ID = 500_000  # apart from the steady load's ids
AFTER_S = 5
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


def test_slow_reset_and_stalled_connections_lose_nothing_on_any_runtime(proxied_broker, tmp_path, record_property):
    """One worker per runtime, all behind the proxy at once: the faults hit them together, as a
    flaky network hits every team of a shared cluster."""
    faults, direct, behind = proxied_broker
    queues, workers, logs = {}, {}, {}
    for runtime, (kind, exactly_once, ordering) in RUNTIMES.items():
        folder = tmp_path / runtime
        folder.mkdir()
        queues[runtime] = make_queue(
            folder,
            direct,
            group_type=kind,
            exactly_once=exactly_once,
            ordering=ordering,
            partitions=3,
            concurrency=8,
            lock="5s",
            max_in_flight=FAULT_TESTS_IN_FLIGHT,
        )
        logs[runtime] = folder / "worker.log"
        workers[runtime] = Supervised(queues[runtime], behind, "--until-idle", "8s", log=logs[runtime], limit=0)
    ledger = FaultLog(direct, {r: (RUNTIMES[r][0], q.group, q.topic, 3) for r, q in queues.items()})
    load = SteadyLoad(direct, [q.topic for q in queues.values()], RATE, sleep_ms=5)
    load.start()
    deadline = time.monotonic() + 240
    for runtime, queue in queues.items():  # every worker under way
        while sum(1 for e in queue.events() if e.get("result") == "ok") < RATE * 3:
            assert time.monotonic() < deadline and workers[runtime].running(), logs[runtime].read_text()[-3000:]
            time.sleep(0.3)
    faulted_at = time.monotonic()
    burst_ids = range(BURST_FIRST_ID, BURST_FIRST_ID + BURST)
    burst = [order(i) for i in burst_ids]
    for queue in queues.values():
        produce(direct, queue.topic, burst)
    for kind_of_fault, attributes, seconds in FAULTS:
        assert load.is_alive(), f"records were still arriving when {kind_of_fault} began"
        ledger.begins(kind_of_fault)  # read directly, not through the proxy
        faults.toxic("broker", kind_of_fault, kind_of_fault, **attributes)
        if kind_of_fault == FAULTS[0][0]:
            in_flight = {runtime: _unhandled(queue, burst_ids) for runtime, queue in queues.items()}
        time.sleep(seconds)
        faults.heal("broker", kind_of_fault)
        ledger.ended()
        healed_at = time.time()
        time.sleep(3)
    time.sleep(AFTER_S)
    steady = load.stop()
    total = steady + BURST
    expected = {f"id-{i:06d}" for i in [*range(steady), *burst_ids]}

    table = {}
    for runtime, queue in queues.items():
        summary = workers[runtime].summary()
        done_s = time.monotonic() - faulted_at
        read = read_all(direct, queue.output, expect_at_least=total, timeout_s=60)
        outputs = [json.loads(m.value())["id"] for m in read]
        missing = expected - set(outputs)
        assert not missing, f"{runtime}: {len(missing)} records never accepted, e.g. {sorted(missing)[:5]}"
        assert read_all(direct, queue.dlq, timeout_s=3) == [], f"{runtime}: every record is valid, none in the DLQ"
        duplicates = len(outputs) - len(set(outputs))
        if RUNTIMES[runtime][1]:
            assert duplicates == 0, "read_committed readers see each output once"
        events = queue.events()
        caught = ledger.in_flight(runtime, events)
        assert duplicate_excess(outputs, caught) is None, f"{runtime}: {duplicate_excess(outputs, caught)}"
        if RUNTIMES[runtime][2] == "key":
            broken = key_order_violations(events)
            assert not broken, f"{runtime}: {len(broken)} keys out of order: " + "; ".join(broken[:3])
        assert summary["lag_at_exit"] == 0, runtime
        assert workers[runtime].restarts == 0, f"{runtime}: the worker rode the faults out"
        table[runtime] = {
            "lost": 0,
            "duplicates": duplicates,
            "in_flight_at_faults": len(caught),
            "restarts": workers[runtime].restarts,
            "burst_unhandled_at_first_fault": in_flight[runtime],
            "recovered_s": round(recovered_after(queue, healed_at), 1),  # after the last fault, the stall
            "done_s": round(done_s),
        }
    record_property("network_faults", table)
    print(f"\nlatency/reset/stall, {total} records per runtime: {table}")


def _unhandled(queue, ids: range) -> int:
    """How many of these records the queue's handler has not yet accepted."""
    done = {e.get("id") for e in queue.events() if e.get("result") == "ok"}
    return sum(1 for i in ids if f"id-{i:06d}" not in done)
