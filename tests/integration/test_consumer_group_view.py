"""Kafka's own view of a consumer queue's group, read as lag exporters, KEDA and operators read it.

A consumer worker's Python processes are members of the queue's group, so AdminClient's
``describe_consumer_groups`` and Kafka's ``kafka-consumer-groups.sh --describe`` list them with
their assignments while it runs, and the group's committed offsets are its progress: never past a
record whose handler has not finished, and at the log's end once it drained.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from helpers import run_cli
from worker_support import TestQueue as Queue
from worker_support import make_queue, order, start_worker

from queueplane.kafka import clients

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 150
# Each call sleeps this long and ordering=partition runs one call a partition at a time, so the
# group's commits move while it is read. The last record of each partition is held until the test
# has read the group (RELEASE), so the worker still runs then, however slow the machine: its
# queue is busy for PER_PARTITION * SLEEP_MS only, and Kafka's tool, a JVM, took longer than that
# to start on a loaded machine.
SLEEP_MS = 100
WAIT_S = 300
HOLD_S = WAIT_S - 60  # the held calls' bound, within the lock
LOCK = f"{WAIT_S}s"
COORDINATOR_BUSY = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
)


def _produce(kafka, topic: str, release: Path) -> None:
    producer = Producer(dict(kafka.settings))
    held = {"until_file": str(release), "until_s": HOLD_S}
    for partition in range(PARTITIONS):
        for i in range(PER_PARTITION):
            fields = {"sleep_ms": SLEEP_MS, **(held if i == PER_PARTITION - 1 else {})}
            producer.produce(topic, order(partition * PER_PARTITION + i, **fields), b"k", partition=partition)
    assert producer.flush(30) == 0


def _members(admin: AdminClient, group: str) -> tuple[str, dict[str, set[int]]]:
    """The group's type (``CONSUMER`` or ``CLASSIC``) and each member's partitions of the queue's
    topic. A coordinator that is loading or moving (a fresh broker's) is asked again."""
    deadline = time.monotonic() + 60
    while True:
        try:
            described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
            break
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in COORDINATOR_BUSY) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    members = {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in described.members}
    return described.type.name, members


def _committed(admin: AdminClient, queue: Queue) -> dict[int, int]:
    wanted = [TopicPartition(queue.topic, p) for p in range(PARTITIONS)]
    request = ConsumerGroupTopicPartitions(queue.group, wanted)
    listed = admin.list_consumer_group_offsets([request], request_timeout=10)[queue.group].result()
    return {tp.partition: tp.offset for tp in listed.topic_partitions}


def _tool_rows(queue: Queue, cli_env: dict[str, str]) -> dict[int, dict[str, str]]:
    """`kafka-consumer-groups.sh --describe --group G`, its table keyed by partition."""
    tool = run_cli(["local", "kafka", "consumer-groups", "--describe", "--group", queue.group], cli_env)
    assert tool.returncode == 0, tool.stderr
    header: list[str] = []
    rows: dict[int, dict[str, str]] = {}
    for line in tool.stdout.splitlines():
        cells = line.split()
        if cells[:2] == ["GROUP", "TOPIC"]:
            header = cells
        elif header and len(cells) == len(header) and cells[1] == queue.topic:
            row = dict(zip(header, cells, strict=True))
            rows[int(row["PARTITION"])] = row
    return rows


def _finished(queue: Queue) -> dict[int, set[int]]:
    """The offsets whose handler call returned, per partition."""
    done: dict[int, set[int]] = defaultdict(set)
    for event in queue.events():
        if event["result"] == "ok":
            done[event["partition"]].add(event["offset"])
    return done


def test_kafkas_tools_list_the_workers_members_and_its_commits_and_lag_are_right(kafka, tmp_path, cli_env):
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering="partition", partitions=PARTITIONS, lock=LOCK)
    release = tmp_path / "release"
    _produce(kafka, queue.topic, release)
    admin = clients.admin(kafka)
    log = tmp_path / "worker.log"
    worker = start_worker(queue, kafka, "--until-idle", "4s", log=log)

    # While it runs: one consistent view (the group did not move between the reads) in which
    # every partition is a member's, as AdminClient and Kafka's tool both show it.
    seen = None
    deadline = time.monotonic() + WAIT_S
    while seen is None:
        assert worker.poll() is None, f"the worker ended before its members were seen:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no member held the partitions:\n{log.read_text()[-3000:]}"
        kind, before = _members(admin, queue.group)
        owned = sorted(p for partitions in before.values() for p in partitions)
        if owned == list(range(PARTITIONS)):
            committed_before = _committed(admin, queue)
            rows = _tool_rows(queue, cli_env)
            committed_after = _committed(admin, queue)
            finished = _finished(queue)
            if _members(admin, queue.group)[1] == before:
                seen = (kind, before, committed_before, rows, committed_after, finished)
        if seen is None:
            time.sleep(0.5)
    kind, members, committed_before, rows, committed_after, finished = seen
    assert kind == "CONSUMER", "a broker with KIP-848's coordinator runs the members on the consumer protocol"
    owner = {p: member for member, partitions in members.items() for p in partitions}
    assert sorted(rows) == list(range(PARTITIONS)), rows
    for partition, row in rows.items():
        assert row["CONSUMER-ID"] == owner[partition], (partition, row, members)
        assert int(row["LOG-END-OFFSET"]) == PER_PARTITION
        if row["CURRENT-OFFSET"] == "-":  # nothing committed yet
            assert committed_before[partition] < 0, (partition, row, committed_before)
            continue
        current = int(row["CURRENT-OFFSET"])
        assert committed_before[partition] <= current <= committed_after[partition], (row, committed_before)
        assert int(row["LAG"]) == PER_PARTITION - current, row
        # Never committed past a record whose handler had not finished.
        assert set(range(committed_after[partition])) <= finished[partition], (partition, committed_after)
    assert worker.poll() is None, "the worker was read while it ran"
    release.touch()

    summary = json.loads(worker.communicate(timeout=WAIT_S)[0])
    assert worker.returncode == 0, log.read_text()[-3000:]
    assert summary["counts"]["accepted"] == PARTITIONS * PER_PARTITION, summary["counts"]

    # Drained: every partition committed to its end, lag 0, and the members have left.
    assert _committed(admin, queue) == dict.fromkeys(range(PARTITIONS), PER_PARTITION)
    rows = _tool_rows(queue, cli_env)
    assert sorted(rows) == list(range(PARTITIONS)), rows
    for row in rows.values():
        assert (row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"]) == (str(PER_PARTITION),) * 2 + ("0",)
        assert row["CONSUMER-ID"] == "-", "a drained worker's members left the group"
    assert _members(admin, queue.group)[1] == {}
