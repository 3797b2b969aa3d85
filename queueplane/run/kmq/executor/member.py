"""A kmq queue's Python worker process as a member of the queue's consumer group.

The member is the consumer group's (consumer/member.py): it joins, is leased by the time-slice
source, pauses while unleased and leaves on a drain, exactly as a consumer queue's member does.
What it does with the records it polls is kmq's: it gathers them into tasks of up to
``maxInFlight`` records a partition (tasks.py: start markers durable, the handler, outputs
durable, end markers) and, once a task has returned, commits the group's offsets past its
records, each commit carrying where the markers partition ended before the task's start
markers (resume.py). From the commit on, a record that did not end is the tracker's to redeliver.

A member has up to ``TASKS_AT_ONCE`` tasks under way: the member's thread starts one (its start
markers durable, its handlers queued) while the one before settles on a thread of its own, and
commits them in the order they started, between polls; no task runs beside one that holds
crash suspects, whose calls run alone (tasks.py). With no task under way, a partition whose
position passed its last commit (transaction markers) is committed there. A revocation (a callback inside a poll)
waits for the tasks under way and commits them before the partitions move; the revoked
partitions' records the member holds and has not started are dropped, and their next owner
reads them from the last commit. A partition given to the member is read from the group's
commit, skipping the records that started since (a member that was killed, or failed,
mid-task): those are the tracker's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from queueplane.handler_api import Record
from queueplane.kafka import clients
from queueplane.kafka.offsets import end_offsets
from queueplane.run.consumer.executor.member import COMMIT_S, IDLE_POLL_S, POLL_RECORDS, POLL_S, GroupMember
from queueplane.run.executor.processes import PerProcess
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.executor import resume
from queueplane.run.kmq.executor.tasks import KmqProcess, KmqSettings, KmqTask
from queueplane.run.outcomes import DELIVERY_TIMEOUT_S, SKIPPED, Outcome, columns_of

log = logging.getLogger("queueplane.worker")

# Tasks a member has under way at once: one settles (end markers, commit) while the next starts.
TASKS_AT_ONCE = 2


class _Running:
    """A task of the member's, under way or settled: what its commit needs.

    Its records run as one KmqTask, or, when a process died in a call of some of them (crash
    suspects), as several in turn: the others first, then each suspect alone, the fewest crashes
    first, its start marker going out only once the task before it ended. A suspect that kills
    its process again then costs only itself a delivery; started beside others, every record not
    yet called would have been charged one too, and a record that only ever waited beside
    killers could reach its delivery limit without a call that returned. The commit, past all
    of them, follows the last.
    """

    def __init__(self, ranges: dict[int, tuple[int, int]], rows: list[Outcome], markers: dict[int, int]):
        # ``markers``: where each of its partitions' markers ended before its start markers: its
        # commit's metadata, below every start marker of this task and of the tasks after it.
        self.ranges, self.rows, self.markers = ranges, rows, markers
        self.tasks: list[KmqTask] = []
        self.suspects = False  # a process died in a call of one of its records' messages
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def settle(self) -> None:
        """Each task in turn (the first was started by the member), until one fails."""
        try:
            for index, task in enumerate(self.tasks):
                if index:
                    task.start()
                task.wait()
        except BaseException as exc:
            self.error = exc

    def drain(self) -> list[Outcome]:
        return self.rows + [row for task in self.tasks for row in task.drain()]


def suspects_apart(records: list[Record], crashes: dict[tuple[int, int], int]) -> tuple[list[list[Record]], bool]:
    """A task's records as the KmqTasks that run them in turn (_Running), and whether any is a
    crash suspect: ``[records]`` when no process died in a call of any (``crashes``: deaths per
    message, where it was first produced); else the others, then each suspect alone, the fewest
    crashes first."""
    if not crashes or not records:
        return ([records] if records else []), False
    innocent: list[Record] = []
    suspected: list[tuple[int, Record]] = []
    for record in records:
        where = km.origin(record.headers, record.topic, record.partition, record.offset)
        count = crashes.get((where.partition, where.offset), 0)
        if count:
            suspected.append((count, record))
        else:
            innocent.append(record)
    if not suspected:
        return [records], False
    # A stable sort: suspects with as many crashes keep the order they came in.
    alone = [[record] for _count, record in sorted(suspected, key=lambda item: item[0])]
    return ([innocent] if innocent else []) + alone, True


class KmqMember(GroupMember):
    """One per Python worker process and kmq queue: the group's consumer, its tasks, its rows."""

    settings: KmqSettings  # type: ignore[assignment]
    process: KmqProcess  # type: ignore[assignment]

    def __init__(self, settings: KmqSettings):
        super().__init__(settings)  # type: ignore[arg-type]
        self.resume = resume.ResumePoint()
        self._admin: Any = None
        self._running: deque[_Running] = deque()  # tasks under way or settled, not yet committed
        self._committed: dict[int, int] = {}  # per partition, the offset this member last committed
        self._next_position_commit = 0.0

    def _new_process(self, settings: Any) -> KmqProcess:  # type: ignore[override]
        return KmqProcess(settings)

    def _finish_timeout_s(self) -> float:
        """Each task under way ends within the lock, its writes within the delivery timeout."""
        return TASKS_AT_ONCE * (self.settings.lock_ms / 1000 + DELIVERY_TIMEOUT_S)

    # -- the member's thread ---------------------------------------------------------------
    def _loop(self) -> None:
        consumer = self._consumer
        while not self._leave.is_set():
            self._raise_if_failing()
            if self._unleased_long():
                return  # no task came for this process: leave, so the group moves its partitions
            leased = self.leased()
            if leased == self._unleased_paused:
                self._pause_for_lease(leased)
            messages = consumer.consume(POLL_RECORDS, POLL_S if self._held or self._running else IDLE_POLL_S)
            if messages:
                self._take_messages(messages)
            self._collect_if_due()
            self._commit_settled()
            self._commit_positions()
            held = sum(len(records) for records in self._held.values())
            # A task as soon as the poll has nothing more, or a full one meanwhile, or nothing runs.
            wanted = not messages or held >= self._task_records() or not self._running
            if held and wanted and len(self._running) < TASKS_AT_ONCE:
                self._start_task()
            self._flow_control()

    def _partition_records(self) -> int:
        """Records of one partition a task takes at most: all of them get start markers at once."""
        s = self.settings
        bound = s.max_uncommitted or s.max_in_flight
        return max(1, min(s.max_in_flight, bound))

    def _task_records(self) -> int:
        s = self.settings
        whole = self._partition_records() * max(1, len(self._held))
        return max(1, min(whole, s.max_uncommitted)) if s.max_uncommitted > 0 else whole

    def _flow_control(self) -> None:
        """A partition holding more than two tasks' worth pauses until a task takes it below one."""
        limit = self._partition_records()
        for partition, records in self._held.items():
            if len(records) > 2 * limit and partition not in self._paused:
                self._consumer.pause([TopicPartition(self.topic, partition)])
                self._paused.add(partition)
        for partition in list(self._paused):
            if len(self._held.get(partition, ())) <= limit:
                self._paused.discard(partition)
                if partition in self._assigned and not self._unleased_paused:
                    self._consumer.resume([TopicPartition(self.topic, partition)])

    def _taken(self) -> tuple[list[Record], list[Record], dict[int, tuple[int, int]]]:
        """The next task's records by partition in offset order, those a restart skips, and per
        partition the offset of its first record and the offset after its last."""
        per_partition, budget = self._partition_records(), self._task_records()
        records: list[Record] = []
        skipped: list[Record] = []
        ranges: dict[int, tuple[int, int]] = {}
        point = self.resume
        for partition in list(self._held):
            held = self._held[partition]
            take = min(len(held), per_partition, budget)
            if take <= 0:
                break
            budget -= take
            first = held[0].offset
            for _ in range(take):
                record = held.popleft()
                if point.skips(partition, record.offset):
                    if point.counted(partition, record.offset):
                        skipped.append(record)
                    continue
                if record.headers:  # a redelivery: its count is in its headers
                    record = replace(record, delivery_count=km.delivery_count(record.headers))
                records.append(record)
            ranges[partition] = (first, record.offset + 1)
            if not held:
                del self._held[partition]
                self._held_since.pop(partition, None)
        return records, skipped, ranges

    def _start_task(self) -> None:
        """The next task over the held records: its start markers durable, its handlers under way.
        It settles on a thread of its own while the member polls and starts the next one."""
        records, skipped, ranges = self._taken()
        parts, suspects = self._suspects_apart(records)
        if self._running and (suspects or any(item.suspects for item in self._running)):
            # A suspect runs alone (_Running): a task beside it must not be under way then, or
            # the suspect's death takes its records with it.
            self._commit_settled(wait=True)
        if self._admin is None:
            self._admin = clients.admin(self.settings.kafka)
        markers = end_offsets(self._admin, self.settings.markers_topic, sorted(ranges))
        running = _Running(ranges, [Outcome.of(record, SKIPPED, None, 0.0, 0) for record in skipped], markers)
        running.suspects = suspects
        self._running.append(running)
        if records:
            running.tasks = [KmqTask(self.process, part) for part in parts]
            running.tasks[0].start()
            running.thread = threading.Thread(target=running.settle, name="qp-kmq-task", daemon=True)
            running.thread.start()

    def _suspects_apart(self, records: list[Record]) -> tuple[list[list[Record]], bool]:
        """``suspects_apart`` with the crash journal as collected now."""
        journal = self.process.journal
        journal.collect()
        return suspects_apart(records, journal.crashes)

    def _commit_settled(self, wait: bool = False, lost: frozenset[int] = frozenset()) -> None:
        """Commit past the tasks that settled, in the order they started (a partition's commits
        move forward only); ``wait``: every task under way too. ``lost``: partitions the group
        gave to others, whose offsets are no longer ours.

        Rows go out only with their commit. The records of a task that failed, or whose commit
        did, and of a lost partition, come again from the last commit: started, so skipped, and
        the skip counts each one that ended (resume.py). Their rows here would count them twice.
        """
        while self._running:
            running = self._running[0]
            if running.thread is not None:
                if wait:
                    running.thread.join()
                elif running.thread.is_alive():
                    return
            self._running.popleft()
            rows = running.drain()
            if running.error is not None:
                raise running.error
            ranges = {p: r for p, r in running.ranges.items() if p not in lost}
            if ranges:
                self._commit(ranges, [row for row in rows if row.partition in ranges], running.markers)

    def _commit_positions(self) -> None:
        """With no task under way and nothing held, each partition whose position passed its
        last commit (transaction markers, aborted records) is committed there, so a drained
        queue shows no lag. The metadata is where the markers end now: no task is under way, so
        every later start marker comes after it. Looked at every ``COMMIT_S``."""
        now = time.monotonic()
        if self._running or now < self._next_position_commit:
            return
        self._next_position_commit = now + COMMIT_S
        behind: list[TopicPartition] = []
        for position in self._consumer.position([TopicPartition(self.topic, p) for p in sorted(self._assigned)]):
            partition = position.partition
            last = self._committed.get(partition, self.resume.floor.get(partition))
            if partition not in self._held and last is not None and position.offset > last:
                behind.append(position)
        if not behind:
            return
        if self._admin is None:
            self._admin = clients.admin(self.settings.kafka)
        try:
            markers = end_offsets(self._admin, self.settings.markers_topic, [tp.partition for tp in behind])
            offsets = [self._offset(tp.partition, tp.offset, markers[tp.partition]) for tp in behind]
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # only lag shown a little high meanwhile: tried again later
            log.warning("%s: committing past transaction markers: %s", self.settings.queue, exc)
            return
        self._committed.update((tp.partition, tp.offset) for tp in behind)

    def _commit(self, ranges: dict[int, tuple[int, int]], rows: list[Outcome], markers: dict[int, int]) -> None:
        """Past a task's records, each partition's commit carrying where its markers ended before
        the task's start markers (resume.py): the start markers of the task that started while this
        one settled are above it, so a member given the partition after this commit finds them. The
        end at commit time would be past them, and would hand those records out again."""
        partitions = sorted(ranges)
        counts: dict[int, int] = {}
        for row in rows:
            counts[row.partition] = counts.get(row.partition, 0) + 1
        tokens = [self.unreported.committing(p, ranges[p][0], ranges[p][1], counts.get(p, 0)) for p in partitions]
        offsets = [self._offset(p, ranges[p][1], markers[p]) for p in partitions]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except BaseException:
            for token in tokens:
                self.unreported.failed(token)
            raise
        self._committed.update((p, ranges[p][1]) for p in partitions)
        self._add_rows(rows, tokens)

    def _offset(self, partition: int, offset: int, markers_end: int) -> TopicPartition:
        """A commit at ``offset``, naming where the next owner reads the markers from (resume.py)."""
        since = self.resume.markers_from(partition, offset, markers_end)
        return TopicPartition(self.topic, partition, offset, metadata=resume.commit_metadata(since))

    def _add_rows(self, rows: list[Outcome], tokens: list[int] | None = None) -> None:
        """Records' outcomes for the next slice (the accepted in runs), with the notes that count them."""
        self._rows_added(([columns_of(rows)] if rows else [], tokens or []))

    def _finish(self, partition: int) -> None:
        """A partition leaves the member: the tasks under way settle and commit first."""
        self._commit_settled(wait=True)
        super()._finish(partition)

    def _finish_all(self) -> None:
        self._commit_settled(wait=True)
        super()._finish_all()

    def _abandon_all(self) -> None:
        """Leaving without committing: the tasks under way settle; their records come again from
        the last commit, and are counted where they are skipped (see _commit_settled)."""
        running, self._running = self._running, deque()
        for item in running:
            if item.thread is not None:
                item.thread.join()
        super()._abandon_all()

    # -- rebalance callbacks (on the member's thread, inside a poll) -----------------------
    def _lost_cb(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """The group gave the partitions to others: the tasks settle, and commit only the rest."""
        try:
            self._commit_settled(wait=True, lost=frozenset(tp.partition for tp in partitions))
        except Exception as exc:
            self._failing = True
            self._fail(exc)
        super()._lost_cb(consumer, partitions)

    def _assigned_cb(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Partitions given to the member: where to resume them, before any of their records comes."""
        super()._assigned_cb(consumer, partitions)
        given = sorted(tp.partition for tp in partitions)
        for partition in given:  # its last commit is the resume point's floor, read below
            self._committed.pop(partition, None)
        s = self.settings
        point = resume.resume_point(s.kafka, s.group_id, s.topic, s.markers_topic, given)
        if point.started:
            log.info(
                "%s: %d records started before partitions %s came here; the tracker has them",
                s.queue,
                sum(len(offsets) for offsets in point.started.values()),
                given,
            )
        self.resume = self.resume.replaced(given, point)


MEMBERS: PerProcess[KmqMember] = PerProcess(lambda text: KmqMember(KmqSettings.from_json(text)))
