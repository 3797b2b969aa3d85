"""The share-group worker on real Spark against the real broker (KIP-932 semantics)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections import Counter, defaultdict

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from fault_checks import broker_progress, duplicate_excess, in_flight
from worker_support import (
    kill_like_a_pod,
    make_queue,
    order,
    overlap_peak,
    produce,
    read_all,
    run_worker,
    run_worker_logged,
    start_worker,
)

from queueplane.run import dead_letters as dlq
from queueplane.run.driver.options import SUMMARY_DEAD_ROWS

pytestmark = pytest.mark.kafka


def _header(message, name: str) -> str | None:
    for key, value in message.headers() or []:
        if key == name:
            return value.decode()
    return None


def test_poison_goes_to_the_dlq_at_once_retries_stop_at_the_limit_and_the_rest_is_accepted_once(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, delivery_limit=3, concurrency=4)
    good = [order(i) for i in range(40)]
    values = [*good, b'{"id": "id-poison", "broken', order(999, mode="retry")]
    produce(kafka, queue.topic, values)

    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == 40
    assert summary["counts"]["dlq"] == 2
    by_error = {d["error"].split(":")[0]: d for d in summary["dead_lettered"]}
    assert by_error["Reject"]["delivery_count"] == 1  # poison: first delivery, straight to the DLQ
    assert by_error["Retry"]["delivery_count"] == 3  # always-retry: exactly deliveryLimit deliveries

    events = queue.events()
    retry_calls = [e for e in events if e.get("id") == "id-000999"]
    assert sorted(e["dc"] for e in retry_calls) == [1, 2, 3]
    assert next(e for e in events if e.get("result") == "not-json")["dc"] == 1

    dead = read_all(kafka, queue.dlq, expect_at_least=2)
    assert len(dead) == 2
    for message in dead:
        assert _header(message, dlq.HEADER_SOURCE_TOPIC) == queue.topic
        assert _header(message, dlq.HEADER_SOURCE_OFFSET) is not None
        assert int(_header(message, dlq.HEADER_FIRST_ATTEMPT_MS)) <= int(_header(message, dlq.HEADER_LAST_ATTEMPT_MS))
    poison = next(m for m in dead if _header(m, dlq.HEADER_ERROR_CLASS) == "Reject")
    assert poison.value() == b'{"id": "id-poison", "broken'  # original key and value kept
    assert _header(poison, dlq.HEADER_DELIVERY_COUNT) == "1"
    retried = next(m for m in dead if _header(m, dlq.HEADER_ERROR_CLASS) == "Retry")
    assert _header(retried, dlq.HEADER_DELIVERY_COUNT) == "3"
    assert _header(retried, dlq.HEADER_ERROR_MESSAGE) == "always retry"

    outputs = Counter(m.value() for m in read_all(kafka, queue.output, expect_at_least=40))
    assert len(outputs) == 40 and set(outputs.values()) == {1}, "each valid record exactly once in the output"
    # Rejected (archived) records are not delivered again: a second run finds nothing to do.
    again = run_worker(queue, kafka, "--until-idle", "3s")
    assert again["counts"] == {"accepted": 0, "released": 0, "dlq": 0}
    assert again["lag_at_exit"] == 0


def test_a_hung_handler_loses_its_record_to_a_redelivery_and_holds_up_nothing_else(kafka, tmp_path):
    # A lock long enough that a busy machine does not let the quick records' locks run out too.
    queue = make_queue(tmp_path, kafka, lock="5s", concurrency=4, delivery_limit=3)
    produce(kafka, queue.topic, [order(0, mode="hang", hang_s=16), *[order(i, sleep_ms=20) for i in range(1, 60)]])

    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == 60 and summary["counts"]["dlq"] == 0
    assert summary["counts"]["released"] == 1

    events = queue.events()
    hung = [e for e in events if e["id"] == "id-000000"]
    first = next(e for e in hung if e["dc"] == 1 and e["result"] == "started")
    # The hung call never finished while the worker ran (it sleeps 16s): it logged no end.
    first_end = next((e["end"] for e in hung if e["dc"] == 1 and e["result"] != "started"), float("inf"))
    second = next(e for e in hung if e["dc"] == 2 and e["result"] == "ok")
    assert second["start"] < first_end, "the redelivery ran while the first call was still hung"
    assert (second["pid"], second["thread"]) != (first["pid"], first["thread"]), "redelivered to another slot"
    others = [e for e in events if e["id"] != "id-000000"]
    assert all(e["dc"] == 1 for e in others), "no other record was delayed past its lock"
    assert max(e["end"] for e in others) < second["start"], "every other record finished without waiting for it"


def test_a_hung_call_inside_a_chunk_of_quick_calls_holds_up_nothing(kafka, tmp_path):
    # Quick calls go to the pool's threads in chunks (a poll's calls to one thread); the hung record
    # sits in the middle of one, so the calls behind it must move to other threads.
    queue = make_queue(tmp_path, kafka, partitions=1, lock="5s", concurrency=4, delivery_limit=3)
    values = [order(i, mode="quick") for i in range(1, 400)]
    values.insert(200, order(0, mode="hang", hang_s=16))
    produce(kafka, queue.topic, values)

    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == 400 and summary["counts"]["dlq"] == 0
    assert summary["counts"]["released"] == 1

    events = queue.events()
    others = [e for e in events if e["id"] != "id-000000"]
    hung = [e for e in events if e["id"] == "id-000000"]
    first = next(e for e in hung if e["dc"] == 1 and e["result"] == "started")
    second = next(e for e in hung if e["dc"] == 2 and e["result"] == "ok")
    assert (second["pid"], second["thread"]) != (first["pid"], first["thread"]), "redelivered to another slot"
    assert all(e["dc"] == 1 for e in others), "no other record was delayed past its lock"
    after = [e for e in others if e["offset"] > first["offset"]]
    assert after and max(e["end"] for e in after) < second["start"], "the calls behind it went to other threads"


def test_more_handler_calls_in_flight_than_partitions(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, partitions=2, concurrency=8, lock="10s")
    produce(kafka, queue.topic, [order(i, sleep_ms=300) for i in range(120)])
    summary = run_worker(queue, kafka, "--until-idle", "4s", "--tasks", "1")
    assert summary["counts"]["accepted"] == 120
    events = queue.events()
    peak = overlap_peak(events)
    assert peak >= 6, f"at most {peak} handler calls overlapped"
    per_partition = defaultdict(set)
    for e in events:
        per_partition[e["partition"]].add(e["thread"])
    assert sum(len(t) for t in per_partition.values()) > 2


def test_kill_9_mid_run_then_restart_loses_nothing(kafka, tmp_path, record_property):
    total = 20_000
    queue = make_queue(tmp_path, kafka, partitions=6, concurrency=8, lock="5s")
    # Each call sleeps 2 ms, so the 20,000 take seconds even on the worker's slots together and
    # a kill at the half-way count lands mid-way however fast the rest of the path gets.
    produce(kafka, queue.topic, [order(i, sleep_ms=2) for i in range(total)])

    worker = start_worker(queue, kafka, "--until-idle", "30s")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and queue.count_events() < total // 2:
        time.sleep(0.1)
    killed_at = time.time()
    kill_like_a_pod(worker)  # the driver, its JVM and every Python worker, as a pod dies
    # What the broker holds as acknowledged once nothing of the worker is left to acknowledge.
    progress = broker_progress(kafka, "share", queue.group, queue.topic, 6)
    before = queue.events()
    handled_before_kill, pids_before = len(before), {e["pid"] for e in before}
    assert 0 < handled_before_kill < total, "the kill must land mid-way"

    summary = run_worker(queue, kafka, "--until-idle", "6s")
    assert summary["lag_at_exit"] == 0

    outputs = [json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total, timeout_s=120)]
    dead = read_all(kafka, queue.dlq, timeout_s=5)
    ended = set(outputs) | {json.loads(m.value())["id"] for m in dead}
    missing = {f"id-{i:06d}" for i in range(total)} - ended
    assert not missing, f"{len(missing)} records neither accepted nor in the DLQ, e.g. {sorted(missing)[:5]}"
    assert dead == [], "every record is valid: none belongs in the DLQ"
    after = [e for e in queue.events() if e["pid"] not in pids_before]
    assert any(e["dc"] >= 2 for e in after), "records locked at the kill were delivered again"
    # Duplicates are records whose acknowledgement was on its way at the kill. The worker commits
    # acknowledgements every 0.1 s while a poll runs (a poll is a whole producer batch, thousands
    # of records), so only calls that ended in the last moments before the kill may come back.
    counts = Counter(outputs)
    duplicated = {record_id for record_id, n in counts.items() if n > 1}
    ended_at = {e["id"]: e["end"] for e in before}
    ages = sorted(killed_at - ended_at[record_id] for record_id in duplicated if record_id in ended_at)
    record_property("share_kill_duplicates", len(duplicated))
    print(
        f"\nshare kill test: {total} records, {handled_before_kill} handled before kill -9, "
        f"{len(duplicated)} duplicated, the oldest handled {ages[-1] if ages else 0:.2f} s before the kill"
    )
    caught = in_flight(before, [(progress, killed_at)])
    assert duplicate_excess(outputs, caught) is None, duplicate_excess(outputs, caught)
    assert len(ages) == len(duplicated), "only records handled before the kill may be handled twice"
    stale = [age for age in ages if age > 1.0]
    assert not stale, f"{len(stale)} records handled over 1 s before the kill came back, the oldest {ages[-1]:.1f} s"


def test_worker_serves_prometheus_metrics_while_it_runs(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, partitions=2, concurrency=4)
    produce(kafka, queue.topic, [*[order(i, sleep_ms=5) for i in range(300)], b"not json"])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = start_worker(queue, kafka, "--until-idle", "5s", "--metrics-port", str(port))
    labels = f'queue="{queue.spec_path.parent.name.replace("queue-", "w-")}"'
    dead_lettered = f'queueplane_records_total{{outcome="dlq",{labels}}} 1.0'
    try:
        deadline, text = time.monotonic() + 120, ""
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
            if dead_lettered in text and "queueplane_backlog_records" in text:
                break
        assert dead_lettered in text
        assert f"queueplane_handler_latency_seconds_count{{{labels}}}" in text
        assert f'queueplane_delivery_count_bucket{{le="1.0",{labels}}}' in text
        assert "queueplane_inflight" in text
        # The probes: the query runs and Kafka answers the backlog reads.
        for path, reason in (("/livez", "the streaming query runs"), ("/readyz", "the query runs and Kafka answers")):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                assert answer.status == 200 and answer.read().decode().strip() == reason
    finally:
        worker.wait(180)
    summary = json.loads(worker.stdout.read())
    assert summary["counts"]["accepted"] == 300 and summary["counts"]["dlq"] == 1


def _set_topic_config(kafka, topic: str, name: str, value: str) -> None:
    admin = AdminClient(dict(kafka.settings))
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([resource])[resource].result()


def _ids(messages) -> list[str]:
    return [json.loads(m.value())["id"] for m in messages]


def test_a_dead_letter_the_dlq_refuses_is_parked_in_the_queue_until_the_dlq_takes_it(kafka, tmp_path):
    """A DLQ that refuses writes (here: records above its max.message.bytes) must not cost the
    record: released at its limit, the broker would archive it, in neither place."""
    queue = make_queue(tmp_path, kafka, delivery_limit=2, concurrency=4)
    _set_topic_config(kafka, queue.dlq, "max.message.bytes", "1000")
    big = [order(900 + i, mode="retry", pad="x" * 3000) for i in range(3)]
    produce(kafka, queue.topic, [*[order(i) for i in range(20)], *big])
    originals = {json.loads(v)["id"]: i for i, v in enumerate([*[order(i) for i in range(20)], *big])}

    summary, log = run_worker_logged(queue, kafka, "--max-duration", "25s")
    assert summary["counts"]["accepted"] == 20
    assert summary["counts"]["dlq"] == 0
    assert "until the DLQ takes it" in log, log[-3000:]
    assert read_all(kafka, queue.dlq, timeout_s=4) == []
    parked = [m for m in read_all(kafka, queue.topic, timeout_s=5) if _header(m, "queueplane.parked") == "1"]
    assert set(_ids(parked)) == {f"id-{900 + i:06d}" for i in range(3)}
    handler_calls = Counter(e["id"] for e in queue.events() if e.get("id", "").startswith("id-0009"))
    assert set(handler_calls.values()) == {2}, "a parked record goes to no handler again"

    _set_topic_config(kafka, queue.dlq, "max.message.bytes", "1048588")  # the DLQ is fixed
    again = run_worker(queue, kafka, "--until-idle", "5s")
    assert again["counts"]["dlq"] == 3
    assert again["lag_at_exit"] == 0
    dead = read_all(kafka, queue.dlq, expect_at_least=3)
    assert sorted(_ids(dead)) == sorted(f"id-{900 + i:06d}" for i in range(3))  # each exactly once
    for message in dead:
        assert _header(message, "queueplane.parked") is None
        assert _header(message, dlq.HEADER_ERROR_CLASS) == "Retry"
        assert _header(message, dlq.HEADER_DELIVERY_COUNT) == "2"
        # The source is the record as produced, not a parked copy of it.
        assert int(_header(message, dlq.HEADER_SOURCE_OFFSET)) >= 0
        assert _header(message, dlq.HEADER_SOURCE_TOPIC) == queue.topic
    sources = {int(_header(m, dlq.HEADER_SOURCE_OFFSET)) for m in dead}
    assert len(sources) == 3
    outputs = _ids(read_all(kafka, queue.output, expect_at_least=20))
    assert sorted(outputs) == sorted(f"id-{i:06d}" for i in range(20))
    assert set(outputs) | set(_ids(dead)) == set(originals)


def test_a_worker_killed_during_a_records_last_delivery_leaves_it_for_the_dlq(kafka, tmp_path):
    """The broker keeps one delivery beyond deliveryLimit: when the last one ends without an
    outcome (kill -9 while the handler runs), the reserve delivery sends the record to the DLQ
    instead of the broker archiving it, as one its process died with."""
    queue = make_queue(tmp_path, kafka, delivery_limit=2, concurrency=4, lock="5s")
    produce(
        kafka,
        queue.topic,
        [*[order(i) for i in range(10)], order(777, mode="hang", fail_until=2, hang_at=2, hang_s=120)],
    )

    worker = start_worker(queue, kafka, "--until-idle", "60s")
    deadline = time.monotonic() + 120
    while not any(e.get("id") == "id-000777" and e["dc"] == 2 and e["result"] == "started" for e in queue.events()):
        assert time.monotonic() < deadline, "the record never reached its last delivery"
        assert worker.poll() is None, "the worker stopped before the record's last delivery"
        time.sleep(0.3)
    kill_like_a_pod(worker)

    summary = run_worker(queue, kafka, "--until-idle", "8s")
    assert summary["lag_at_exit"] == 0
    (dead,) = read_all(kafka, queue.dlq, expect_at_least=1)
    assert _ids([dead]) == ["id-000777"]
    # Its call was running when the worker died: the crash journal tells the next process so.
    assert _header(dead, dlq.HEADER_ERROR_CLASS) == "WorkerDied", _header(dead, dlq.HEADER_ERROR_MESSAGE)
    assert "died 1 time(s)" in _header(dead, dlq.HEADER_ERROR_MESSAGE)
    assert _header(dead, dlq.HEADER_DELIVERY_COUNT) == "3"
    calls = sorted(e["dc"] for e in queue.events() if e.get("id") == "id-000777" and e.get("result") != "started")
    assert 3 not in calls, "the reserve delivery calls no handler"
    assert sorted(_ids(read_all(kafka, queue.output, expect_at_least=10))) == [f"id-{i:06d}" for i in range(10)]


def test_a_poison_flood_keeps_the_summary_bounded_and_counts_every_dead_letter(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, concurrency=4)
    flood = SUMMARY_DEAD_ROWS * 3
    produce(kafka, queue.topic, [b"not json %d" % i for i in range(flood)] + [order(i) for i in range(10)])
    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["dlq"] == flood and summary["counts"]["accepted"] == 10
    assert len(summary["dead_lettered"]) == SUMMARY_DEAD_ROWS  # the driver keeps a sample, not every row
    assert summary["dead_lettered_by_delivery_count"] == {"1": flood}
    assert len(read_all(kafka, queue.dlq, expect_at_least=flood)) == flood
