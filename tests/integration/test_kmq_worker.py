"""The kmq worker and its redelivery tracker on real Spark against the real broker."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest
from helpers import wait_for
from worker_support import (
    Supervised,
    kill_like_a_pod,
    make_queue,
    order,
    produce,
    read_all,
    run_worker,
    start_worker,
)

from queueplane.run import dead_letters as dlq
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.tracker import redelivery_grace_ms

pytestmark = pytest.mark.kafka
LOCK_MS = 3000
LIMIT = 3
# Past its grace, the tracker redelivers within a step once it has read the markers written until
# then; the rest is slack for a busy machine (the driver's Python shares two cores with Spark,
# the broker and the handlers).
SLACK_MS = 2000


def _on_time(produced_ms: int, due_ms: int) -> None:
    """A redelivery is produced once its deadline and its grace have passed, and soon after."""
    grace_ms = redelivery_grace_ms(LOCK_MS)
    assert due_ms + grace_ms <= produced_ms <= due_ms + grace_ms + SLACK_MS, (due_ms, grace_ms, produced_ms)


def _header(message, name: str) -> str | None:
    return next((v.decode() for k, v in message.headers() or [] if k == name), None)


def _finish(worker, timeout_s: float = 400) -> dict:
    out, _ = worker.communicate(timeout=timeout_s)
    assert worker.returncode == 0, out[-3000:]
    return json.loads(out)


def _markers(kafka, topic: str) -> list[km.Marker]:
    return [marker for m in read_all(kafka, topic, expect_at_least=1) for marker in km.decode(m.key(), m.value())]


def _settled(events: list[dict], hang: int, fail: int) -> bool:
    """The hung record ran to its end twice (late, then redelivered) and the failing one LIMIT times."""
    hung = [e for e in events if e["id"] == f"id-{hang:06d}" and e["result"] == "ok"]
    failed = [e for e in events if e["id"] == f"id-{fail:06d}"]
    return len(hung) >= 2 and len(failed) >= LIMIT


def test_hung_handler_is_redelivered_after_the_lock_and_failures_end_in_the_dlq(kafka, tmp_path):
    queue = make_queue(
        tmp_path,
        kafka,
        group_type="kmq",
        lock=f"{LOCK_MS}ms",
        delivery_limit=LIMIT,
        partitions=2,
        concurrency=16,
        retry={"backoff": "200ms", "maxBackoff": "500ms"},
    )
    markers_topic = f"{queue.topic}.markers"
    warmup = 20
    produce(kafka, queue.topic, [order(i) for i in range(warmup)])
    # The worker is stopped as a pod is (SIGTERM) once every outcome under test is in, not by an
    # idle bound: the warm-up waits below can outlast any such bound on a busy machine, and the
    # worker would stop before the records under test arrive.
    worker = start_worker(queue, kafka, log=tmp_path / "worker.log")
    hang, fail = warmup, warmup + 1
    try:
        # Both queries are up and through their first batches before the records under test arrive.
        wait_for("the warm-up records", lambda: len(queue.events()) >= warmup, 240, every_s=0.5)
        wait_for("the warm-up end markers", lambda: len(_markers(kafka, markers_topic)) >= 2 * warmup, 60, every_s=0.5)
        produce(kafka, queue.topic, [order(hang, mode="hang", hang_s=12), order(fail, mode="retry"), b"not json"])
        # The hung call's late return (delivery 1) and its redelivery (2) both ran, and the failing
        # record had its last delivery: a batch that settles it is in hand when the signal comes.
        wait_for(
            "the hung call's late return, its redelivery and the failing record's last delivery",
            lambda: _settled(queue.events(), hang, fail),
            300,
            every_s=0.5,
        )
        worker.send_signal(signal.SIGTERM)
        summary = _finish(worker)
    finally:
        if worker.poll() is None:
            kill_like_a_pod(worker)

    events = queue.events()
    hung = sorted((e for e in events if e["id"] == f"id-{hang:06d}" and e["result"] == "ok"), key=lambda e: e["dc"])
    assert [e["dc"] for e in hung] == [1, 2], "the hung call returned late (dropped); the redelivery ran"
    outputs = Counter(json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=warmup + 1))
    assert outputs[f"id-{hang:06d}"] == 1, "accepted once: the late result of the first delivery was dropped"
    assert set(outputs) == {f"id-{i:06d}" for i in range(warmup + 1)} and max(outputs.values()) == 1

    # The redelivery: a new record on the queue topic, delivery count 2, produced once the lock ran out.
    on_topic = read_all(kafka, queue.topic, expect_at_least=warmup + 3 + 1 + (LIMIT - 1))
    copies = [
        m for m in on_topic if _header(m, dlq.HEADER_DELIVERY_COUNT) and json.loads(m.value())["id"] == f"id-{hang:06d}"
    ]
    (copy,) = copies
    assert _header(copy, dlq.HEADER_DELIVERY_COUNT) == "2"
    original = next(m for m in on_topic if m.value() == order(hang, mode="hang", hang_s=12) and not m.headers())
    assert _header(copy, dlq.HEADER_SOURCE_OFFSET) == str(original.offset())
    markers = _markers(kafka, markers_topic)
    (start,) = [
        m for m in markers if (m.partition, m.offset, m.kind) == (original.partition(), original.offset(), km.START)
    ]
    _on_time(copy.timestamp()[1], start.at_ms + LOCK_MS)
    ended = {(m.partition, m.offset) for m in markers if m.kind in km.ENDS}
    started = {(m.partition, m.offset) for m in markers if m.kind == km.START}
    assert started <= ended, "every delivery ended: by the worker, or by the tracker when it redelivered"

    # Always failing: exactly deliveryLimit deliveries, then the DLQ; poison: the DLQ at once.
    attempts = sorted(e["dc"] for e in events if e["id"] == f"id-{fail:06d}")
    assert attempts == list(range(1, LIMIT + 1))
    dead = {(_header(m, dlq.HEADER_ERROR_CLASS)): m for m in read_all(kafka, queue.dlq, expect_at_least=2)}
    assert set(dead) == {"Retry", "Reject"}
    for message in dead.values():
        names = [k for k, _ in message.headers()]
        assert set(dlq.DLQ_HEADERS) <= set(names), names
    failed = dead["Retry"]
    assert json.loads(failed.value())["id"] == f"id-{fail:06d}"
    assert _header(failed, dlq.HEADER_DELIVERY_COUNT) == str(LIMIT)
    assert _header(failed, dlq.HEADER_SOURCE_TOPIC) == queue.topic
    first_fail = next(m for m in on_topic if m.value() == order(fail, mode="retry") and not m.headers())
    assert _header(failed, dlq.HEADER_SOURCE_OFFSET) == str(first_fail.offset())
    # Each retry waits its backoff (200ms, then 200-400ms: the upper half of min(500ms, 200ms *
    # 2^(k-1))), then comes back as a timed-out delivery does.
    retried = [m for m in on_topic if m.value().startswith(b"{") and json.loads(m.value())["id"] == f"id-{fail:06d}"]
    at = {(m.partition(), m.offset()) for m in retried}
    retries = sorted(
        (m for m in markers if m.kind == km.RETRY and (m.partition, m.offset) in at), key=lambda m: m.at_ms
    )
    assert [m.delivery_count for m in retries] == list(range(1, LIMIT)), retries
    copies = {int(_header(m, dlq.HEADER_DELIVERY_COUNT) or 1): m for m in retried}
    for marker, (low, high) in zip(retries, [(200, 200), (200, 400)], strict=True):
        assert low <= marker.delay_ms <= high, marker
        _on_time(copies[marker.delivery_count + 1].timestamp()[1], marker.at_ms + marker.delay_ms)
    assert dead["Reject"].value() == b"not json" and _header(dead["Reject"], dlq.HEADER_DELIVERY_COUNT) == "1"

    counts = summary["counts"]
    assert counts["accepted"] == warmup + 1 and counts["dlq"] == 2
    assert counts["redelivered"] == 1 + (LIMIT - 1)
    assert summary["lag_at_exit"] == 0


def test_records_a_task_could_not_start_within_its_lock_come_back_with_their_delivery_uncounted(kafka, tmp_path):
    """A task takes more records than its handler can start within lockDuration (one thread, 100 ms
    a call, a 2 s lock), as a slow network or a loaded machine makes it do: those never called
    are released and come back with the same delivery count. With deliveryLimit 1, a record goes
    to the DLQ only after a call of it ran past the lock; were a delivery never called counted,
    every record not started in time would be dead-lettered."""
    total = 60
    queue = make_queue(
        tmp_path, kafka, group_type="kmq", lock="2s", partitions=1, concurrency=1, delivery_limit=1, max_in_flight=100
    )
    produce(kafka, queue.topic, [order(i, sleep_ms=100) for i in range(total)])
    summary = run_worker(queue, kafka, "--until-idle", "8s", timeout=400)

    released = [m for m in _markers(kafka, f"{queue.topic}.markers") if m.kind == km.RELEASE]
    assert released, "the first task took more records than it could start within its lock"
    assert {m.delivery_count for m in released} == {1}
    events = queue.events()
    called = {e["id"] for e in events}
    dead = {json.loads(m.value())["id"]: m for m in read_all(kafka, queue.dlq, timeout_s=3)}
    assert all(_header(m, dlq.HEADER_ERROR_CLASS) == "Timeout" for m in dead.values())
    assert set(dead) <= called, f"dead-lettered without a call: {sorted(set(dead) - called)[:5]}"
    outputs = Counter(
        json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total - len(dead))
    )
    assert set(outputs) | set(dead) == {f"id-{i:06d}" for i in range(total)}, "nothing lost"
    assert max(outputs.values()) == 1 and not set(outputs) & set(dead)
    assert {e["dc"] for e in events} == {1}, "a released record comes back as the same delivery"
    assert summary["counts"]["accepted"] == len(outputs) and summary["lag_at_exit"] == 0


def test_kill_minus_9_between_start_and_end_markers_loses_nothing(kafka, tmp_path):
    total, hangs = 20_000, 8
    queue = make_queue(tmp_path, kafka, group_type="kmq", lock="4s", partitions=2, concurrency=16, delivery_limit=5)
    hang_ids = set(range(5_000, total, total // hangs))
    produce(kafka, queue.topic, [order(i, mode="hang", hang_s=60) if i in hang_ids else order(i) for i in range(total)])
    args = ("--max-batch-records", "2000", "--checkpoint-dir", str(tmp_path / "ckpt"))
    # Supervised, as its Deployment would: a worker that gives up on a starved machine (a Spark
    # Python worker not connecting back in time) is started again, and its open deliveries count.
    worker = Supervised(queue, kafka, "--until-idle", "5s", *args, log=tmp_path / "worker.log")
    try:
        # A hung handler has started: its start marker is durable, no end marker can have been written.
        worker.wait_for("a hung handler", lambda: any(e.get("result") == "started" for e in queue.events()), 300)
    finally:
        kill_like_a_pod(worker.process)
    killed_at = time.time()
    markers = _markers(kafka, f"{queue.topic}.markers")
    ended = {(m.partition, m.offset) for m in markers if m.kind in km.ENDS}
    open_at_kill = {(m.partition, m.offset) for m in markers if m.kind == km.START} - ended
    assert open_at_kill, "the kill came between start and end markers"

    summary = _finish(start_worker(queue, kafka, "--until-idle", "8s", *args), timeout_s=900)
    outputs = Counter(json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total))
    missing = {f"id-{i:06d}" for i in range(total)} - set(outputs)
    duplicates = sum(n - 1 for n in outputs.values())
    print(f"kmq kill -9: {len(open_at_kill)} deliveries open at the kill, {duplicates} duplicate outputs, 0 lost")
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    # Only a delivery open at the kill (started, not ended) can be handled twice.
    assert duplicates <= len(open_at_kill), (duplicates, len(open_at_kill))
    assert read_all(kafka, queue.dlq, timeout_s=3) == [], "every record is valid: none belongs in the DLQ"
    events = queue.events()
    for i in hang_ids:
        redone = [e for e in events if e["id"] == f"id-{i:06d}" and e["result"] == "ok" and e["start"] > killed_at]
        assert any(e["dc"] >= 2 for e in redone), f"id-{i:06d} was not redelivered after the restart"
    assert summary["lag_at_exit"] == 0


def test_without_any_checkpoint_the_tracker_rebuilds_open_deliveries_from_the_markers(kafka, tmp_path):
    """A worker killed with a delivery open restarts on new, empty checkpoints (a pod on a fresh
    volume): the worker starts at the group's commits and skips what had started; the tracker
    reads the markers topic from its group's commit (at the oldest marker of a delivery it
    held open) and redelivers the open delivery."""
    total, hung = 300, 150
    queue = make_queue(tmp_path, kafka, group_type="kmq", lock="3s", partitions=2, delivery_limit=LIMIT)
    produce(kafka, queue.topic, [order(i, mode="hang", hang_s=60) if i == hung else order(i) for i in range(total)])
    first = ("--until-idle", "30s", "--checkpoint-dir", str(tmp_path / "first"))
    worker = Supervised(queue, kafka, *first, log=tmp_path / "worker.log")
    try:
        worker.wait_for("the hung handler", lambda: any(e.get("result") == "started" for e in queue.events()), 300)
    finally:
        kill_like_a_pod(worker.process)
    markers = _markers(kafka, f"{queue.topic}.markers")
    ended = {(m.partition, m.offset) for m in markers if m.kind in km.ENDS}
    open_at_kill = {(m.partition, m.offset) for m in markers if m.kind == km.START} - ended
    assert open_at_kill, "the kill came with a delivery open"

    summary = _finish(start_worker(queue, kafka, "--until-idle", "8s", "--checkpoint-dir", str(tmp_path / "fresh")))
    outputs = Counter(json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total))
    assert sorted(outputs) == [f"id-{i:06d}" for i in range(total)], "nothing lost"
    duplicates = sum(n - 1 for n in outputs.values())
    assert duplicates <= len(open_at_kill), (duplicates, len(open_at_kill))
    again = [e for e in queue.events() if e["id"] == f"id-{hung:06d}" and e["result"] == "ok"]
    assert again and all(e["dc"] >= 2 for e in again), "the open delivery came back through the rebuilt tracker"
    assert read_all(kafka, queue.dlq, timeout_s=3) == []
    assert summary["lag_at_exit"] == 0
