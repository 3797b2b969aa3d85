"""Where a kmq member resumes a partition, through three owners, on the real broker (no Spark).

An owner that dies mid-task leaves records started: the next owner skips them and the tracker
redelivers them. If that next owner commits below one of them and then dies too, the third
owner must still find it started: its start marker was written by the first owner, before any
of the second owner's own markers, and the second owner's commit says where to read from.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from worker_support import make_queue, order, produce

from queueplane.kafka import clients
from queueplane.kafka.offsets import end_offsets
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.executor import resume

pytestmark = pytest.mark.kafka

FIRST_TASK = range(0, 10)  # the first owner started these and died before any commit
SECOND_TASK = range(10, 14)  # the second owner's own task, started after it skipped 0-4


def _write_starts(producer, topic: str, offsets: range, at_ms: int) -> None:
    for partition, key, value in km.records([km.Marker(0, o, km.START, 1, at_ms, 5000) for o in offsets]):
        producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


def test_records_the_first_owner_started_stay_skipped_after_the_second_commits_below_them(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, group_type="kmq", partitions=1)
    markers_topic = f"{queue.topic}.markers"
    produce(kafka, queue.topic, [order(i) for i in range(20)])
    producer = clients.producer(kafka.settings, {"enable.idempotence": True})
    admin = clients.admin(kafka.settings)
    now_ms = int(time.time() * 1000)
    _write_starts(producer, markers_topic, FIRST_TASK, now_ms)

    second = resume.resume_point(kafka.settings, queue.group, queue.topic, markers_topic, [0])
    assert second.started == {0: frozenset(FIRST_TASK)} and second.floor == {}
    # Its first task takes offsets 0-4, all skipped, and commits at 5; its next task's start
    # markers are written meanwhile, after where the markers ended when that first task began.
    markers_end = end_offsets(admin, markers_topic, [0])[0]
    _write_starts(producer, markers_topic, SECOND_TASK, now_ms)
    metadata = resume.commit_metadata(second.markers_from(0, 5, markers_end))
    committer = clients.consumer(kafka.settings, {"group.id": queue.group, "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition(queue.topic, 0, 5, metadata=metadata)], asynchronous=False)
    finally:
        committer.close()

    # The second owner dies. The third resumes from offset 5 and must skip 5-9 (the tracker's)
    # as well as the second owner's 10-13.
    third = resume.resume_point(kafka.settings, queue.group, queue.topic, markers_topic, [0])
    assert third.floor == {0: 5}
    assert third.started == {0: frozenset([*range(5, 10), *SECOND_TASK])}
    assert [o for o in range(20) if not third.skips(0, o)] == list(range(14, 20))
