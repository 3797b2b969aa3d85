"""The consumer-group worker on real Spark (its built-in Kafka source) against the real broker."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from fault_checks import FaultLog, duplicate_excess, key_order_violations
from helpers import wait_for
from worker_support import (
    kill_like_a_pod,
    make_queue,
    order,
    overlap_peak,
    pause_like_a_zombie,
    produce,
    read_all,
    resume,
    run_worker,
    run_worker_logged,
    start_worker,
)

from queueplane.kafka import names as kn
from queueplane.run import dead_letters as dlq
from queueplane.run.consumer.executor.ordering import key_slot

pytestmark = pytest.mark.kafka


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
    assert max(overlap_peak(calls) for calls in by_partition.values()) >= 4
    outputs = [json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total)]
    assert sorted(outputs) == sorted(f"id-{i:06d}" for i in range(total))


def test_each_handler_call_sees_its_own_records_headers_and_none_where_the_record_has_none(kafka, tmp_path):
    """Records with and without headers, mixed in one partition and one batch: the source's null
    list for a record without headers must reach the handler as no headers, and a header list
    (repeated names, a null value) must reach it whole and in order."""
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering="partition", partitions=1)
    total = 60
    sent = {
        f"id-{i:06d}": [] if i % 3 == 0 else [["trace", f"t-{i}"], ["tag", None], ["trace", f"u-{i}"]][: 1 + i % 3]
        for i in range(total)
    }
    # Both kinds in the batch, and a null header value among them.
    assert sum(1 for h in sent.values() if not h) == total // 3 and any(["tag", None] in h for h in sent.values())
    produce(
        kafka,
        queue.topic,
        [order(i) for i in range(total)],
        headers=[[(k, None if v is None else v.encode()) for k, v in h] for h in sent.values()],
    )

    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == total and summary["counts"]["dlq"] == 0
    seen = {e["id"]: e["headers"] for e in queue.events()}
    assert seen == sent


def _header(message, name: str) -> str | None:
    return next((v.decode() for k, v in message.headers() or [] if k == name), None)


def test_a_retried_record_is_attempted_deliverylimit_times_with_backoff_and_holds_up_only_its_key(kafka, tmp_path):
    slots, limit = 4, 4
    queue = make_queue(
        tmp_path,
        kafka,
        group_type="consumer",
        ordering="key",
        partitions=1,
        concurrency=slots,
        delivery_limit=limit,
        retry={"backoff": "200ms", "maxBackoff": "500ms"},
    )
    stuck_key = b"key-stuck"
    others = [
        k for k in (f"key-{i:02d}".encode() for i in range(40)) if key_slot(k, slots) != key_slot(stuck_key, slots)
    ]
    values = [order(0, mode="retry"), order(1), order(2)]
    keys = [stuck_key, stuck_key, stuck_key]
    for i, key in enumerate(others[:30], start=3):
        values.append(order(i, sleep_ms=5))
        keys.append(key)
    produce(kafka, queue.topic, values, keys=keys)

    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == len(values) - 1
    assert summary["counts"]["dlq"] == 1 and summary["counts"]["released"] == limit - 1
    assert summary["dead_lettered"][0]["delivery_count"] == limit

    events = queue.events()
    attempts = sorted((e for e in events if e["id"] == "id-000000"), key=lambda e: e["start"])
    assert [e["dc"] for e in attempts] == list(range(1, limit + 1)), "attempted exactly deliveryLimit times"
    # Attempt k waits within the upper half of min(500ms, 200ms * 2^(k-1)), never under 200ms:
    # 200ms, then 200-400ms, then 250-500ms. A thread's wake-up may add a little, never subtract.
    windows = [(0.2, 0.2), (0.2, 0.4), (0.25, 0.5)]
    for (earlier, later), (low, high) in zip(itertools.pairwise(attempts), windows, strict=True):
        gap = later["start"] - earlier["end"]
        assert low - 0.005 <= gap <= high + 0.15, f"gap after attempt {earlier['dc']}: {gap:.3f}s, not {low}..{high}s"
    gave_up = attempts[-1]["end"]
    same_key = [e for e in events if e["id"] in ("id-000001", "id-000002")]
    assert len(same_key) == 2 and all(e["start"] >= gave_up for e in same_key), "later records of the key waited"
    other_keys = [e for e in events if e["key"] != stuck_key.decode()]
    assert len(other_keys) == 30 and max(e["end"] for e in other_keys) < attempts[-1]["start"], (
        "other keys did not wait"
    )

    (dead,) = read_all(kafka, queue.dlq, expect_at_least=1)
    assert dead.key() == stuck_key and json.loads(dead.value())["id"] == "id-000000"
    assert _header(dead, dlq.HEADER_DELIVERY_COUNT) == str(limit)
    assert _header(dead, dlq.HEADER_ERROR_CLASS) == "Retry"
    assert _header(dead, dlq.HEADER_SOURCE_OFFSET) == "0"
    first, last = int(_header(dead, dlq.HEADER_FIRST_ATTEMPT_MS)), int(_header(dead, dlq.HEADER_LAST_ATTEMPT_MS))
    assert last - first >= 3 * 195


def _kill_midway_and_restart(kafka, tmp_path, *, exactly_once: bool) -> tuple[list[str], dict, int, set[str]]:
    """20k records; kill -9 the worker (driver, JVM, Python workers) mid-way; restart on the same checkpoint."""
    total = 20_000
    queue = make_queue(
        tmp_path, kafka, group_type="consumer", ordering="key", partitions=6, concurrency=8, exactly_once=exactly_once
    )
    produce(
        kafka, queue.topic, [order(i) for i in range(total)], keys=[f"key-{i % 32:02d}".encode() for i in range(total)]
    )
    checkpoint = str(tmp_path / "checkpoint")
    args = ("--checkpoint-dir", checkpoint, "--max-batch-records", "3000")
    worker = start_worker(queue, kafka, "--until-idle", "30s", *args)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(queue.events()) < total // 4:
        time.sleep(0.5)
    faults = FaultLog(kafka, {"queue": ("consumer", queue.group, queue.topic, 6)})
    faults.begins("kill -9")
    kill_like_a_pod(worker)
    faults.ended()
    before = queue.events()
    handled_before_kill = len(before)
    assert 0 < handled_before_kill < total, "the kill must land mid-way"

    # The restarted run's calls are those that start after it does: Spark's Python daemon keeps its
    # workers in a process group of their own, so a killed run's worker may log a call or two more.
    restarted_at = time.time()
    summary = run_worker(queue, kafka, "--until-idle", "6s", *args)
    assert summary["lag_at_exit"] == 0
    outputs = [json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total, timeout_s=120)]
    missing = {f"id-{i:06d}" for i in range(total)} - set(outputs)
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:5]}"
    assert read_all(kafka, queue.dlq, timeout_s=3) == [], "every record is valid: none belongs in the DLQ"
    # Per key, the restarted worker handles records in offset order; a replay (a batch whose
    # transaction or commit did not land) goes back and brings the key's records again, in order.
    after = [e for e in queue.events() if e["start"] >= restarted_at]
    assert after, "the restarted worker handled records"
    broken = key_order_violations(after)
    assert not broken, f"{len(broken)} keys out of order after the restart: {broken[:3]}; summary {summary}"
    return outputs, summary, handled_before_kill, faults.in_flight("queue", queue.events())


def test_kill_9_mid_run_then_restart_loses_nothing_at_least_once(kafka, tmp_path, record_property):
    outputs, summary, before, caught = _kill_midway_and_restart(kafka, tmp_path, exactly_once=False)
    duplicates = len(outputs) - len(set(outputs))
    assert duplicate_excess(outputs, caught) is None, duplicate_excess(outputs, caught)
    record_property("consumer_kill_duplicates", duplicates)
    print(
        f"\nconsumer kill test (at-least-once): 20000 records, {before} handled before kill -9, "
        f"{duplicates} duplicate outputs ({len(caught)} in flight), "
        f"{summary['counts'].get('skipped', 0)} skipped as already committed"
    )


def test_kill_9_mid_run_then_restart_writes_each_output_exactly_once(kafka, tmp_path, record_property):
    outputs, summary, before, _ = _kill_midway_and_restart(kafka, tmp_path, exactly_once=True)
    repeated = {k: n for k, n in Counter(outputs).items() if n > 1}
    assert not repeated, f"{len(repeated)} outputs seen more than once with read_committed, e.g. {list(repeated)[:5]}"
    assert len(outputs) == 20_000
    record_property("consumer_eos_skipped", summary["counts"].get("skipped", 0))
    print(
        f"\nconsumer kill test (exactly-once): {before} handled before kill -9, each of 20000 outputs once; "
        f"{summary['counts'].get('skipped', 0)} records skipped as already committed"
    )


def test_a_frozen_exactly_once_worker_that_wakes_after_its_replacement_is_fenced(kafka, tmp_path):
    """A zombie: a worker frozen mid-transaction (a long pause, a network partition) while a new one
    takes the queue over from the group's commits, then woken. The new worker's transactional
    producers fence the old one's: its open transactions are aborted and it cannot commit again,
    so read_committed readers see every output once."""
    total = 6000
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering="key", partitions=3, exactly_once=True)
    produce(
        kafka,
        queue.topic,
        [order(i, sleep_ms=2) for i in range(total)],
        keys=[f"key-{i % 32:02d}".encode() for i in range(total)],
    )
    batches = ("--max-batch-records", "600")
    log = tmp_path / "zombie.log"
    zombie = start_worker(
        queue, kafka, "--until-idle", "15s", "--checkpoint-dir", str(tmp_path / "old"), *batches, log=log
    )
    deadline = time.monotonic() + 240
    while len(queue.events()) < total // 4:
        assert time.monotonic() < deadline and zombie.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    frozen = pause_like_a_zombie(zombie)
    frozen_at = len(queue.events())
    assert frozen_at < total, "frozen with records still to handle"

    replacement = run_worker(queue, kafka, "--until-idle", "6s", "--checkpoint-dir", str(tmp_path / "new"), *batches)
    assert replacement["lag_at_exit"] == 0
    resume(frozen)
    try:
        zombie.wait(120)  # it wakes, finds its transactions fenced, and stops or goes idle
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_like_a_pod(zombie)

    outputs = Counter(
        json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=total, timeout_s=60)
    )
    assert set(outputs) == {f"id-{i:06d}" for i in range(total)}, "nothing lost"
    repeated = {k: n for k, n in outputs.items() if n > 1}
    assert not repeated, f"{len(repeated)} outputs visible twice, e.g. {list(repeated)[:5]}"
    assert read_all(kafka, queue.dlq, timeout_s=3) == []
    assert replacement["counts"]["accepted"] >= total - frozen_at, "the replacement did the rest"
    # Frozen inside a transaction, the woken worker's commit is refused (_FENCED, seen in most
    # runs); frozen between two, its next task's producer fences the replacement's instead and
    # finds the group's offsets past its records. Either way no output shows twice (above).
    fenced = "code=_FENCED" in log.read_text()
    print(f"\nzombie: frozen after {frozen_at} calls, fenced: {fenced}")


def test_a_transaction_left_open_mid_run_is_fenced_by_the_partitions_next_owner(kafka, tmp_path):
    """A member whose commit timed out in a broker outage fails and leaves the group; its process
    lives on, and so does its producer's transaction, the group's offsets sent into it. Until
    that transaction ends the offsets are unstable, and every read_committed read of them waits,
    the next owner's own fetch position too: no record comes, so no task of its fences the
    producer. The worker fenced every partition when it started, not since; the next owner must
    fence the partition before it reads, or the queue stalls for the transaction's timeout (15
    min here), and for good while its owner keeps it open."""
    total = 100
    queue = make_queue(tmp_path, kafka, group_type="consumer", partitions=1, exactly_once=True)
    produce(kafka, queue.topic, [order(i) for i in range(total)])
    log = tmp_path / "worker.log"
    worker = start_worker(queue, kafka, "--until-idle", "10s", log=log)
    wait_for("the first records handled", lambda: len(queue.events()) >= total, 180, every_s=0.5)

    # The transaction left open: its producer fences the member's (whose next commit fails, so
    # the member leaves the group) and sends the group's offsets into a transaction it never ends.
    transactional_id = f"{kn.transactional_id_prefix(queue.group)}{queue.topic}.0"
    stuck = Producer({**kafka.settings, "transactional.id": transactional_id, "transaction.timeout.ms": 900_000})
    stuck.init_transactions(30)
    stuck.begin_transaction()
    stuck.produce(queue.output, json.dumps({"id": "never-committed"}).encode())
    group = Consumer({**kafka.settings, "group.id": queue.group})
    try:
        stuck.send_offsets_to_transaction([TopicPartition(queue.topic, 0, total)], group.consumer_group_metadata(), 30)
    finally:
        group.close()
    produce(kafka, queue.topic, [order(i) for i in range(total, 2 * total)])

    try:
        summary = json.loads(worker.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
        kill_like_a_pod(worker)
        raise AssertionError("the queue stalled behind the open transaction: " + log.read_text()[-3000:]) from None
    assert worker.returncode == 0 and summary["lag_at_exit"] == 0, log.read_text()[-3000:]
    counts = summary["counts"]
    assert counts["accepted"] + counts.get("skipped", 0) == 2 * total, summary  # each record counted once
    outputs = Counter(json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=2 * total))
    assert set(outputs) == {f"id-{i:06d}" for i in range(2 * total)}, "every record, none of the open transaction"
    assert max(outputs.values()) == 1, "read_committed readers see each output once"
    with pytest.raises(KafkaException, match=r"(?i)fenced"):
        stuck.commit_transaction(30)


@pytest.mark.parametrize("group_type", ["consumer", "kmq"])
def test_records_retention_removed_unread_are_counted_and_reported(kafka, tmp_path, group_type):
    queue = make_queue(tmp_path, kafka, group_type=group_type, partitions=1)
    produce(kafka, queue.topic, [order(i) for i in range(100)])
    first = run_worker(queue, kafka, "--until-idle", "4s")
    assert first["counts"]["accepted"] == 100 and first["removed_by_retention"] == 0
    # While no worker runs, 100 more arrive and retention removes 60 of them unread (DeleteRecords
    # moves the log's start offset exactly as a deleted segment does).
    produce(kafka, queue.topic, [order(i) for i in range(100, 200)])
    admin = AdminClient(dict(kafka.settings))
    (future,) = admin.delete_records([TopicPartition(queue.topic, 0, 160)]).values()
    future.result()

    summary, log = run_worker_logged(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == 40
    assert summary["removed_by_retention"] == 60
    assert "60 records of" in log and "removed by retention" in log
    outputs = {json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=140)}
    assert outputs == {f"id-{i:06d}" for i in (*range(100), *range(160, 200))}


@pytest.mark.parametrize("group_type", ["consumer", "kmq"])
def test_start_from_latest_skips_only_what_came_before_the_groups_first_read(kafka, tmp_path, group_type):
    """``startFrom: latest`` is for a group that never committed; one that did resumes at its
    commit, or at the first record retention left past it, never at the end of the log."""
    queue = make_queue(tmp_path, kafka, group_type=group_type, partitions=1, start_from="latest")
    produce(kafka, queue.topic, [order(i) for i in range(100)])
    first = run_worker(queue, kafka, "--until-idle", "4s")
    assert first["counts"].get("accepted", 0) == 0, "a new group with latest reads nothing already there"
    # An operator resets the group to offset 50 (kafka-consumer-groups --reset-offsets), and
    # retention removes the records up to 80 before the worker comes back.
    admin = AdminClient(dict(kafka.settings))
    reset = ConsumerGroupTopicPartitions(queue.group, [TopicPartition(queue.topic, 0, 50)])
    admin.alter_consumer_group_offsets([reset])[queue.group].result()
    (future,) = admin.delete_records([TopicPartition(queue.topic, 0, 80)]).values()
    future.result()

    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == 20, summary["counts"]
    assert summary["removed_by_retention"] == 30
    outputs = {json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=20)}
    assert outputs == {f"id-{i:06d}" for i in range(80, 100)}


REJECTED = {5, 77, 240}


def _records(first: int, end: int) -> list[bytes]:
    return [order(i, mode="reject") if i in REJECTED else order(i, sleep_ms=5) for i in range(first, end)]


@pytest.mark.parametrize("ordering", ["partition", "none"])
def test_partition_and_no_ordering_reject_and_resume_from_the_groups_commits(kafka, tmp_path, ordering):
    """ordering partition and none, Reject to the DLQ; for partition, restarts from an older
    checkpoint (records below the group's commit are skipped) and with none (the group's commits)."""
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering=ordering, partitions=2, concurrency=4)
    checkpoint = tmp_path / "checkpoint"
    produce(kafka, queue.topic, _records(0, 150))
    first = run_worker(queue, kafka, "--until-idle", "3s", "--checkpoint-dir", str(checkpoint))
    assert (first["counts"]["accepted"], first["counts"]["dlq"]) == (148, 2), first["counts"]
    handled = [e for e in queue.events() if e["result"] == "ok"]
    for partition in (0, 1):
        calls = sorted((e for e in handled if e["partition"] == partition), key=lambda e: e["start"])
        if ordering == "partition":
            assert [e["offset"] for e in calls] == sorted(e["offset"] for e in calls), "offset order per partition"
            assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(calls)), "one call at a time"
        else:
            assert overlap_peak(calls) >= 2, "records of one partition run at once"
    if ordering == "none":
        return

    # Written with Java's own file calls (session.with_local_checkpoints): no checksum files.
    assert list((checkpoint / "commits").iterdir()), "the run's batches are in its checkpoint"
    assert not list(checkpoint.rglob("*.crc")), "no .crc beside a local checkpoint's files"
    older = tmp_path / "checkpoint-older"
    shutil.copytree(checkpoint, older)
    produce(kafka, queue.topic, _records(150, 300))
    second = run_worker(queue, kafka, "--until-idle", "3s", "--checkpoint-dir", str(checkpoint))
    assert (second["counts"]["accepted"], second["counts"]["dlq"]) == (149, 1), second["counts"]
    # The older checkpoint replays 150..299: the group committed them, so they are skipped, not redone.
    third = run_worker(queue, kafka, "--until-idle", "3s", "--checkpoint-dir", str(older))
    assert (third["counts"]["accepted"], third["counts"].get("skipped")) == (0, 150), third["counts"]
    # Without a checkpoint the worker starts at the group's commits: only the new records.
    produce(kafka, queue.topic, _records(300, 350))
    fourth = run_worker(queue, kafka, "--until-idle", "3s")
    assert (fourth["counts"]["accepted"], fourth["counts"].get("skipped", 0)) == (50, 0), fourth["counts"]
    name = yaml.safe_load(queue.spec_path.read_text())["metadata"]["name"]
    left = list(Path(tempfile.gettempdir()).glob(f"queueplane-{name}-*"))
    assert not left, f"a run leaves no temporary checkpoint or drain folder behind: {left}"

    outputs = Counter(json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=347))
    assert sorted(outputs) == sorted(f"id-{i:06d}" for i in range(350) if i not in REJECTED)
    assert set(outputs.values()) == {1}, "no output written twice"
    dead = read_all(kafka, queue.dlq, expect_at_least=3)
    assert sorted(json.loads(m.value())["id"] for m in dead) == [f"id-{i:06d}" for i in sorted(REJECTED)]
    for message in dead:
        headers = {k: v.decode() for k, v in message.headers()}
        assert (headers[dlq.HEADER_ERROR_CLASS], headers[dlq.HEADER_DELIVERY_COUNT]) == ("Reject", "1")


def test_tasks_finished_together_still_commit_past_a_trailing_transaction_marker(kafka, tmp_path):
    """Over ``--max-batch-records`` a member finishes its tasks together (each record here), and a
    partition that then gets no record has no task. Its position past the commit marker after
    its last record is committed all the same: otherwise the caught-up queue shows a lag of one
    for good and never stops on ``--until-idle`` (seen on a loaded machine, where slow flushes
    finish tasks together)."""
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering="key", partitions=1)
    producer = Producer({**kafka.settings, "transactional.id": f"writer-{queue.topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(20):
        producer.produce(queue.topic, order(i, sleep_ms=20), key=f"key-{i % 4}".encode())
    producer.commit_transaction(30)

    summary = run_worker(queue, kafka, "--until-idle", "4s", "--max-batch-records", "1", timeout=120)
    assert summary["counts"]["accepted"] == 20, summary
    assert summary["lag_at_exit"] == 0, "the group's commit passed the marker"
