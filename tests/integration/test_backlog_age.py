"""The age of a queue's oldest unfinished record, read from a real broker (the Airflow sensor's lag)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer, TopicPartition
from specs_factory import spec

from queueplane.kafka import clients
from queueplane.kafka.cluster import Cluster
from queueplane.kafka.lag import BacklogReader
from queueplane.ops.backlog_age import OldestWaiting, oldest_waiting_seconds
from queueplane.ops.dlq import DeadLetterCounter, redrive_group
from queueplane.provision import steps
from queueplane.spec.model import build

pytestmark = pytest.mark.kafka


def _queue(kafka, kind: str, tmp_path):
    tag = uuid.uuid4().hex[:8]
    doc = spec(kind, name=f"age-{tag}", group=f"age-{tag}", topic=f"age.{tag}.v1")
    doc["spec"]["topic"]["partitions"] = 2
    queue = build(doc, str(tmp_path / "q.yaml"))
    planned = steps.plan_queues([queue], Cluster(kafka))
    steps.apply(planned)
    return queue


PRODUCED_AT = time.time()  # records are stamped this many seconds before this instant


def _produce(kafka, topic: str, partition: int, ages_s: list[float]) -> None:
    producer = Producer(dict(kafka.settings))
    for age in ages_s:
        producer.produce(topic, b"x", partition=partition, timestamp=int((PRODUCED_AT - age) * 1000))
    assert producer.flush(10) == 0


def _age(kafka, queue) -> float:
    """The oldest record's age as stamped (time since PRODUCED_AT taken off), 0 when nothing waits.

    Read once the group coordinator answers: right after the topic is created it may still be loading.
    """
    deadline = time.monotonic() + 60
    while (age := oldest_waiting_seconds(kafka, queue, now=PRODUCED_AT)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert age is not None
    return round(age, 1)


def test_share_queue_age_is_its_oldest_record_until_the_group_finishes_it(kafka, tmp_path):
    queue = _queue(kafka, "share", tmp_path)
    assert _age(kafka, queue) == 0.0
    _produce(kafka, queue.topic.name, 0, [120, 5])
    _produce(kafka, queue.topic.name, 1, [40])
    assert _age(kafka, queue) == 120

    # The group finishes the oldest record and gives the others back: the 40 s one is now the oldest.
    consumer = ShareConsumer({**kafka.settings, "group.id": queue.group.id, "share.acknowledgement.mode": "explicit"})
    consumer.subscribe([queue.topic.name])
    seen: set[tuple[int, int]] = set()  # released records come back: count each record once
    deadline = time.monotonic() + 120
    while len(seen) < 3 and time.monotonic() < deadline:
        for message in consumer.poll(0.5) or []:
            if message.error():
                continue
            seen.add((message.partition(), message.offset()))
            oldest = (message.partition(), message.offset()) == (0, 0)
            consumer.acknowledge(message, AcknowledgeType.ACCEPT if oldest else AcknowledgeType.RELEASE)
    consumer.commit_sync()
    consumer.close()
    assert seen == {(0, 0), (0, 1), (1, 0)}
    deadline = time.monotonic() + 60
    while _age(kafka, queue) != 40 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _age(kafka, queue) == 40


def test_consumer_group_age_starts_at_the_committed_offset(kafka, tmp_path):
    queue = _queue(kafka, "consumer", tmp_path)
    _produce(kafka, queue.topic.name, 0, [600, 60])
    assert _age(kafka, queue) == 600  # nothing committed: from the start

    committer = Consumer({**kafka.settings, "group.id": queue.group.id, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(queue.topic.name, 0, 1)], asynchronous=False)
    assert _age(kafka, queue) == 60

    committer.commit(offsets=[TopicPartition(queue.topic.name, 0, 2)], asynchronous=False)
    committer.close()
    assert _age(kafka, queue) == 0.0


def test_a_watched_workers_reads_follow_the_group_with_the_clients_they_made_first(kafka, tmp_path, monkeypatch):
    """A worker reads its backlog every second and the oldest wait and the DLQ every few
    seconds, for as long as it runs: each reader makes its consumer once, then reads the
    group's commits and the DLQ as they move."""
    queue = _queue(kafka, "consumer", tmp_path)
    _produce(kafka, queue.topic.name, 0, [600, 60])
    assert _age(kafka, queue) == 600  # the coordinator answers: what follows reads without retrying

    made: list[str] = []
    real = clients.consumer
    monkeypatch.setattr(clients, "consumer", lambda cluster, role: made.append(role["group.id"]) or real(cluster, role))
    backlog, oldest, dead = BacklogReader(kafka, queue), OldestWaiting(kafka, queue), DeadLetterCounter(kafka, queue)

    def age() -> float:
        seconds = oldest(PRODUCED_AT)
        assert seconds is not None
        return round(seconds, 1)

    assert (backlog(), age(), dead()) == ({0: 2, 1: 0}, 600, 0)

    committer = Consumer({**kafka.settings, "group.id": queue.group.id, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(queue.topic.name, 0, 1)], asynchronous=False)
    _produce(kafka, queue.dead_letter.name, 0, [1, 1, 1])
    assert (backlog(), age(), dead()) == ({0: 1, 1: 0}, 60, 3)

    committer.commit(offsets=[TopicPartition(queue.topic.name, 0, 2)], asynchronous=False)
    committer.close()
    _produce(kafka, queue.dead_letter.name, 1, [1])
    assert (backlog(), age(), dead()) == ({0: 0, 1: 0}, 0.0, 4)
    # The backlog's and the age's readers of the group's commits, the age's reader of records, the DLQ's.
    group, age_group = queue.group.id, f"queueplane-backlog-age-{queue.group.id}"
    assert sorted(made) == sorted([group, group, age_group, redrive_group(queue)])
