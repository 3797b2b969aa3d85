"""The group's offsets past what a micro-batch read but no handler saw: transaction markers.

A transactional producer (an upstream exactly-once job, or ``dlq redrive``) writes a commit
or abort marker after its records, and a read_committed reader skips aborted records; both
take offsets. Committing "last record + 1" leaves the group short of them for good: the lag
stays above zero, so a caught-up queue never looks caught up (``--until-idle`` never ends,
autoscaling keeps a backlog of markers). Spark's Kafka source reads a partition in ranges
whose end covers them, and writes each batch's range ends to the checkpoint's offsets log
before the batch runs; once the batch has finished, every record below those ends is done,
so the group may move to them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, TopicPartition

from queueplane.kafka import clients
from queueplane.kafka.offsets import fetch_committed
from queueplane.kafka.target import KafkaTarget

log = logging.getLogger("queueplane.worker")

COMMIT_RETRY_S = 60.0


def batch_range_ends(checkpoint: str, batch_id: int, topic: str) -> dict[int, int]:
    """Where batch ``batch_id`` read ``topic`` up to, per partition (Spark's offsets log); empty if unreadable.

    The log's entry is ``v1``, a line of batch metadata, then a line of offsets per source.
    """
    path = Path(checkpoint.removeprefix("file:")) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines[2:]:
        try:
            offsets = json.loads(line)
        except ValueError:
            continue
        if isinstance(offsets, dict) and isinstance(offsets.get(topic), dict):
            return {int(p): int(o) for p, o in offsets[topic].items()}
    return {}


def handled_ends(table: pa.Table) -> dict[int, int]:
    """Per partition, the offset after the last record a batch's outcome rows hold (a row's last
    record is at its ``last_offset``: a row may stand for a run of records, outcomes.py)."""
    if table.num_rows == 0:
        return {}
    ends = table.group_by("partition").aggregate([("last_offset", "max")])
    return {
        int(p): int(o) + 1
        for p, o in zip(ends.column("partition").to_pylist(), ends.column("last_offset_max").to_pylist(), strict=True)
    }


def markers_only(ranges: dict[int, int], table: pa.Table) -> dict[int, int]:
    """The partitions whose range ends beyond the last record handled (or that held no record at all)."""
    handled = handled_ends(table)
    return {p: end for p, end in ranges.items() if end > handled.get(p, -1)}


def retry_commit(
    commit: Callable[[], None], renew: Callable[[], None], what: str, within_s: float = COMMIT_RETRY_S
) -> bool:
    """Run a driver-side group commit, retried while the cluster does not answer; False if it never did.

    Such a commit only moves the group past work the checkpoint already holds: when it fails,
    the next batch's commit covers it, so the worker goes on rather than fail the query. Each
    retry starts with new clients (``renew``): one that lived through a broker restart can keep
    failing with stale metadata (FENCED_LEADER_EPOCH, "no leaders") after the broker is back.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            commit()
            return True
        except (KafkaException, TimeoutError) as exc:  # TimeoutError: a request's future not done in time
            if time.monotonic() > deadline:
                log.warning("%s not committed (%s); the next batch commits them", what, exc)
                return False
            time.sleep(1.0)
            renew()


class RangeEndCommitter:
    """Moves a group's offsets to the range ends of a finished batch where only markers lie beyond
    the last record (consumer groups, whose tasks commit up to their last record).

    It never moves an offset back (a replay from an older checkpoint ends below the group's
    commit), and it asks the broker only when a range ends beyond what it last committed.
    """

    def __init__(self, target: KafkaTarget, group: str, topic: str):
        self.target, self.group, self.topic = target, group, topic
        self.consumer = self._consumer()
        self.known: dict[int, int] = {}  # per partition, the offset this committer last saw committed or set

    def _consumer(self) -> Consumer:
        role = {"group.id": self.group, "enable.auto.commit": False, "isolation.level": "read_committed"}
        return clients.consumer(self.target.settings, role)

    def _renew(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()
        self.consumer = self._consumer()

    def commit(self, ranges: dict[int, int], table: pa.Table) -> None:
        wanted = {p: end for p, end in markers_only(ranges, table).items() if end > self.known.get(p, -1)}
        if not wanted:
            return

        def commit() -> None:
            committed = fetch_committed(self.consumer, self.topic, sorted(wanted))
            moves = {p: end for p, end in wanted.items() if (committed.get(p) or 0) < end}
            if moves:
                offsets = [TopicPartition(self.topic, p, end) for p, end in sorted(moves.items())]
                self.consumer.commit(offsets=offsets, asynchronous=False)
                log.debug("group offsets moved over transaction markers: %s", moves)

        if retry_commit(commit, self._renew, "group offsets past transaction markers"):
            self.known.update(wanted)

    def close(self) -> None:
        self.consumer.close()
