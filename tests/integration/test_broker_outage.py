"""Broker outages on every runtime, at start and mid-run: nothing lost, and no worker ends.

The test stops and restarts a broker of its own (``own_broker``: same data directory, same
ports), so the session's shared broker stays up for every other test. Every worker rides both
outages out: one that ended would be restarted by its Deployment, so the test allows none.
Duplicates stay within what was in flight when an outage began (``fault_checks``), and a
key-ordered consumer queue keeps each key's order, a duplicate coming only as a replayed suffix.
"""

from __future__ import annotations

import json
import threading
import time

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

pytestmark = [pytest.mark.kafka, pytest.mark.heavy(paired=True)]

# Mid-run, longer than a synchronous group commit waits for its coordinator (45 s measured) and
# than the kmq tracker's metadata interval (30 s): each of a worker's calls to the broker fails
# at least once during it, and a worker that does not ride that out ends.
OUTAGE_S = 75
START_OUTAGE_S = 30
INITIAL = 20_000  # waiting before the workers start: in flight through both outages
RATE = 30  # then arriving steadily, so the mid-run outage is mid-run for every worker
AFTER_S = 10  # and for a while after it
HUNG = 5  # records whose first delivery runs past the lock: redelivered across the outages
# A worker that handles nothing for this long has stopped: longer than a restart under a Supervised
# worker takes on a busy machine (Spark up, the broker answering, the first batch planned).
STALL_S = 240


def test_broker_outages_at_start_and_mid_run_lose_nothing_on_any_runtime(own_broker, tmp_path, record_property):
    """One worker per runtime on one broker, as teams share a cluster: the broker is down when they
    start (up 30 s later), then stopped for 75 s while records arrive. No worker gives up: each
    waits for its broker, then rides the mid-run outage out (``limit=0``: a restart fails the test)."""
    stack, kafka = own_broker
    queues, logs = {}, {}
    initial = [order(i, mode="hang", hang_s=8) if i < HUNG else order(i) for i in range(INITIAL)]
    for runtime, (kind, exactly_once, ordering) in RUNTIMES.items():
        folder = tmp_path / runtime
        folder.mkdir()
        queues[runtime] = make_queue(
            folder,
            kafka,
            group_type=kind,
            exactly_once=exactly_once,
            ordering=ordering,
            partitions=3,
            concurrency=8,
            lock="4s",
            delivery_limit=5,
            max_in_flight=FAULT_TESTS_IN_FLIGHT,
        )
        logs[runtime] = folder / "worker.log"
        produce(kafka, queues[runtime].topic, initial)
    faults = FaultLog(kafka, {r: (RUNTIMES[r][0], q.group, q.topic, 3) for r, q in queues.items()})

    faults.begins_before_any_work("outage at start")
    stack.down()  # the workers start first (pods scheduled before their broker is back)
    try:
        # A short idle bound: the driver never counts an outage as idle (no batch yet, or no lag it can read).
        workers = {
            runtime: Supervised(queue, kafka, "--until-idle", "8s", log=logs[runtime], limit=0)
            for runtime, queue in queues.items()
        }
        time.sleep(START_OUTAGE_S)
        for runtime, worker in workers.items():
            assert worker.process.poll() is None, (
                f"{runtime} waits for the broker: " + logs[runtime].read_text()[-2000:]
            )
    finally:
        stack.up()
        faults.ended()
    broker_up = threading.Event()
    broker_up.set()
    load = SteadyLoad(kafka, [q.topic for q in queues.values()], RATE, first_id=INITIAL, gate=broker_up)
    load.start()
    for runtime, queue in queues.items():
        # Bounded by progress, not by a total: a busy machine slows the workers, a stalled one stops them.
        # Calls are counted, not parsed: parsing tens of thousands of lines a second would take the
        # CPU the four workers share.
        calls, progressed_at = 0, time.monotonic()
        while calls < INITIAL // 2:
            assert time.monotonic() - progressed_at < STALL_S, logs[runtime].read_text()[-3000:]
            assert workers[runtime].running(), logs[runtime].read_text()[-3000:]
            time.sleep(1)
            if (now := queue.count_events()) > calls:
                calls, progressed_at = now, time.monotonic()
    assert load.is_alive(), "records still arrive when the broker stops"
    broker_up.clear()
    faults.begins("outage mid-run")
    stack.down()  # mid-run, with hung records locked and the rest in flight
    stopped_at = time.monotonic()
    time.sleep(OUTAGE_S)
    stack.up()
    faults.ended()
    up_at = time.time()
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
        if RUNTIMES[runtime][1]:
            assert duplicates == 0, "read_committed readers see each output once"
        events = queue.events()
        caught = faults.in_flight(runtime, events)
        assert duplicate_excess(outputs, caught) is None, f"{runtime}: {duplicate_excess(outputs, caught)}"
        if RUNTIMES[runtime][2] == "key":
            broken = key_order_violations(events)
            assert not broken, f"{runtime}: {len(broken)} keys out of order: " + "; ".join(broken[:3])
        assert workers[runtime].restarts == 0, f"{runtime}: the worker rode both outages out"
        (outage,) = [o for o in summary["kafka_outages"] if o["seconds"] >= OUTAGE_S / 2]
        assert outage["error"], outage
        assert "kafka client error _TRANSPORT" in logs[runtime].read_text(), f"{runtime}: the clients' errors logged"
        table[runtime] = {
            "lost": 0,
            "duplicates": duplicates,
            "in_flight_at_outages": len(caught),
            "restarts": workers[runtime].restarts,
            "recovered_s": round(recovered_after(queue, up_at), 1),
            "done_s": round(done_s),
        }
    record_property("broker_outages", table)
    print(f"\n{START_OUTAGE_S}s down at start, {OUTAGE_S}s mid-run, {total} records per runtime: {table}")
