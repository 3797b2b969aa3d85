"""Where a kmq member resumes a partition it is given: the records it must not hand out again.

A member that gets a partition reads it from the group's committed offset. A member that held
it before and was killed (or failed) mid-task left its records in one of two states: started
(a ``start`` marker is durable; from then on the tracker owns the record and redelivers it
unless an ``end`` marker follows) or not yet started. Handing a started record out again would
duplicate every record the killed task had finished, so the new owner skips them and leaves
them to the tracker; only the deliveries that were running at the kill can be handled twice.

Finding the started records needs the markers written since the last group commit. Each
commit carries, as its offset metadata, where the markers partition ended before the committed
task wrote its start markers: every ``start`` marker of a later record is written after it (a
member starts its next task while the last one settles, so the end at commit time could be past
the next task's start markers), and the new owner reads the markers partition from there to its
end, a task or two's worth of markers. A partition the group never
committed (its first task was killed) is read from its first retained marker.

A member that skipped started records carries the position its own scan began at in every
commit below the last of them: their start markers came before its tasks' own, so a commit
naming only where its task's markers began would hide them from the next owner, who would hand
them out again although the tracker has them.

A skipped record gets a row of its own only if a worker ended it (an ``end`` marker): the
killed task's row went with it. One the tracker ended (``expired``) is counted where its copy
or its dead letter is, and one still open is the tracker's to end: neither gets a row here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from queueplane.kafka import clients
from queueplane.kafka.consumed import offset_of, partition_of
from queueplane.kafka.offsets import committed_positions, log_offsets
from queueplane.run.kmq import markers as km

log = logging.getLogger("queueplane.worker")

METADATA_PREFIX = "markers@"
SCAN_TIMEOUT_S = 60.0


def commit_metadata(markers_end: int) -> str:
    """The offset metadata of a group commit: where the markers partition ended when it was made."""
    return f"{METADATA_PREFIX}{markers_end}"


def markers_start(metadata: str | None) -> int | None:
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return None
    text = metadata[len(METADATA_PREFIX) :]
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class ResumePoint:
    """Per queue partition: the committed offset, and the offsets at or above it that already started."""

    floor: dict[int, int] = field(default_factory=dict)
    started: dict[int, frozenset[int]] = field(default_factory=dict)
    # Of those, the ones no end marker had followed when the point was read: the tracker
    # redelivers them, and the copy's row counts the message, so a skip of one counts nothing.
    unended: dict[int, frozenset[int]] = field(default_factory=dict)
    # Per partition, where in the markers partition the scan that found ``started`` began.
    since: dict[int, int] = field(default_factory=dict)

    @cached_property
    def _last_started(self) -> dict[int, int]:
        return {p: max(offsets) for p, offsets in self.started.items() if offsets}

    def markers_from(self, partition: int, committed: int, markers_end: int) -> int:
        """The markers position a commit at ``committed`` names: ``markers_end`` (where the
        committed task's start markers began), or where this point's scan began while a record
        it found started lies at or above the commit, so the next owner finds that one too."""
        since = self.since.get(partition)
        if since is not None and self._last_started.get(partition, -1) >= committed:
            return min(since, markers_end)
        return markers_end

    def counted(self, partition: int, offset: int) -> bool:
        """Whether a skipped record gets a row of its own (its delivery ended before the skip)."""
        return offset not in self.unended.get(partition, ())

    def skips(self, partition: int, offset: int) -> bool:
        floor = self.floor.get(partition)
        return (floor is not None and offset < floor) or offset in self.started.get(partition, ())

    def replaced(self, partitions: list[int], point: ResumePoint) -> ResumePoint:
        """This point with ``partitions``' entries taken from ``point`` (partitions given anew)."""
        keep = set(partitions)
        floor = {p: o for p, o in self.floor.items() if p not in keep} | point.floor
        started = {p: o for p, o in self.started.items() if p not in keep} | point.started
        unended = {p: o for p, o in self.unended.items() if p not in keep} | point.unended
        since = {p: o for p, o in self.since.items() if p not in keep} | point.since
        return ResumePoint(floor, started, unended, since)


def resume_point(
    kafka: dict[str, Any], group_id: str, topic: str, markers_topic: str, partitions: list[int]
) -> ResumePoint:
    """The resume point of ``partitions`` from the group's commits and the markers written since;
    empty if they cannot be read. An empty point costs duplicates (a killed task's records are
    handled again), never a record."""
    if not partitions:
        return ResumePoint()
    role = {"group.id": group_id, "enable.auto.commit": False, "isolation.level": "read_committed"}
    consumer = clients.consumer(kafka, role)
    try:
        committed = committed_positions(consumer, topic, partitions)
        floor = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
        starts: dict[int, int] = {}
        for tp in committed:
            # Never committed (a first task killed): every retained marker of the partition.
            start = markers_start(tp.metadata) if tp.offset >= 0 else 0
            if start is not None:
                starts[tp.partition] = start
        started, ended = _started_since(consumer, kafka, markers_topic, max(partitions) + 1, starts, floor)
        unended = {p: frozenset(offsets - ended.get(p, frozenset())) for p, offsets in started.items()}
        return ResumePoint(floor, started, unended, starts)
    except Exception as exc:  # a resume point only saves duplicates: without one, nothing is lost
        log.warning("kmq: could not read where partitions %s stopped (%s); started records run again", partitions, exc)
        return ResumePoint()
    finally:
        consumer.close()


def _started_since(
    consumer: Consumer,
    kafka: dict[str, Any],
    markers_topic: str,
    partitions: int,
    starts: dict[int, int],
    floor: dict[int, int],
) -> tuple[dict[int, frozenset[int]], dict[int, frozenset[int]]]:
    """Offsets at or above the floor with a ``start`` marker in the markers partitions from ``starts``
    to their end, and those with an ``end`` marker there."""
    if not starts:
        return {}, {}
    retained = log_offsets(clients.admin(kafka), markers_topic, partitions)
    # Retention may have removed markers below a recorded position: read from the first one left.
    begin = {p: max(starts[p], retained[p][0]) for p in starts}
    todo = {p: retained[p][1] for p in starts if retained[p][1] > begin[p]}
    found: dict[int, set[int]] = {p: set() for p in starts}
    ended: dict[int, set[int]] = {}
    if not todo:
        return {}, {}
    consumer.assign([TopicPartition(markers_topic, p, begin[p]) for p in todo])
    deadline = time.monotonic() + SCAN_TIMEOUT_S
    while todo:
        if time.monotonic() > deadline:
            raise TimeoutError(f"markers of partitions {sorted(todo)} not read within {SCAN_TIMEOUT_S:.0f}s")
        message = consumer.poll(0.5)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                continue
            raise RuntimeError(error.str())
        key = message.key()
        for marker in [] if key is None or km.is_tick(key) else km.decode(key, message.value()):
            if marker.offset < floor.get(marker.partition, 0):
                continue
            if marker.kind == km.START:
                found.setdefault(marker.partition, set()).add(marker.offset)
            elif marker.kind == km.END:
                ended.setdefault(marker.partition, set()).add(marker.offset)
        partition = partition_of(message)
        if offset_of(message) + 1 >= todo.get(partition, 0):
            todo.pop(partition, None)
    frozen = {p: frozenset(offsets) for p, offsets in ended.items()}
    return {p: frozenset(offsets) for p, offsets in found.items() if offsets}, frozen
