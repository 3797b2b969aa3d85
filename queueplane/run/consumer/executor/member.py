"""A consumer-group queue's Python worker process as a member of the queue's consumer group.

Each Spark Python worker process of a consumer queue keeps one subscribed consumer of the
queue's group (KIP-848 ``group.protocol=consumer`` where the broker has it, classic otherwise),
so Kafka's own view of the group (``kafka-consumer-groups --describe``, AdminClient, lag
exporters, KEDA) lists the worker's members with their assignments and commits. The member's
thread reads while a micro-batch task of the time-slice source (source.py) holds a lease on it,
and for ``LEASE_GRACE_S`` past it; the tasks only collect the outcome rows of what was
committed meanwhile, as share groups' do.

The member's partitions each have a ``PartitionTask`` (partition.py) that lives across time
slices: slots, retries in place, the offset tracker. Everything that talks to the group runs on
the consumer's own thread, between polls: commits every second (``COMMIT_S``), and the
revocation callback, which finishes the revoked partitions' tasks (slots idle, outputs
durable, offsets committed) before the partitions move. exactlyOnce transactions send the
group metadata the member's thread notes every second (``_note_group``; a join clears the note,
and the first transaction after it reads the metadata on that thread, see
``WorkerProcess.transaction_group``): asked for from another thread during a revocation, it
does not come until the group gives up on the member.

A partition with ``maxInFlight`` records taken and unfinished holds what it polled beyond them;
once that has waited ``PAUSE_AFTER_S`` for quick slots the partition is paused
(``consumer.pause``) and resumed when half of them are done, so one slow partition holds back
neither the member's other partitions nor its heartbeats.

A task that fails (a write or commit the broker refused, a delivery timeout) makes the member
leave the group without committing anything more, so its partitions are read again from the
last commit; the next slice reports the error and the one after it joins afresh. A draining
slice (a stop, a scale-down) and a lease that no task renewed for ``IDLE_LEAVE_S`` finish every
task, commit and leave, so the partitions move at once. Static membership is not used: a static
member does not leave the group when it closes, so every scale-down would hold its partitions
for a session.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any

from confluent_kafka import OFFSET_END, OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from queueplane.handler_api import Record
from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.offsets import fetch_committed
from queueplane.run.consumer.executor.partition import PartitionTask
from queueplane.run.consumer.executor.process import ConsumerSettings, WorkerProcess
from queueplane.run.consumer.executor.unreported import Range, SliceId, Unreported
from queueplane.run.executor.crash_journal import journal_folder
from queueplane.run.executor.processes import PerProcess
from queueplane.run.outcomes import DELIVERY_TIMEOUT_S, SKIPPED, Outcome, OutcomeColumns, columns_of

log = logging.getLogger("queueplane.worker")

COMMIT_S = 1.0  # how often the member commits its tasks' finished prefixes
POLL_S = 0.05  # the longest one poll waits, so commits and the lease are looked at often
# ... while records are held or unfinished. With none, a record wakes the poll at once, and what
# else the loop looks at (a lease renewed or over, a commit of a task's last records, a stop) can
# wait this long: an idle member's thread woke twenty times a second for nothing.
IDLE_POLL_S = 0.5
POLL_RECORDS = 2000
LEASE_GRACE_S = 3.0  # the member reads on past a slice, through Spark's gap between two batches
IDLE_LEAVE_S = 3.0  # a lease over for this long (no task came to this process): leave the group
IDLE_AFTER_S = 30.0  # a member with no rows for this long holds its tasks for the idle slice
PAUSE_AFTER_S = 0.05  # how long polled records wait for quick slots before their partition pauses
QUIET_WAIT_S = 0.02  # how long a commit waits for the producer to hold nothing unacknowledged
ACK_WAIT_S = 0.1  # how long the slots' writes wait at the gate for what they wrote to be acknowledged
FINISH_AFTER_S = 2 * COMMIT_S  # a partition not committed for this long: the tasks finish together
# A member that holds more partitions than its share (the first to join, before the slice's other
# members have) is about to give some up, and a partition moves only once every record its task
# took is finished (``_revoked_cb``): a slow handler's full slot queues held it for seconds. So
# such a member takes few records a slot until the group settles, for at most SETTLE_S after its
# assignment last grew.
SETTLE_S = 3.0
SETTLING_SLOT_RECORDS = 16


class MemberFailed(RuntimeError):
    """The member left the group without committing: its partitions are read again."""


class GroupMember:
    """One per Python worker process and consumer queue: the group's consumer, its tasks, its rows."""

    def __init__(self, settings: ConsumerSettings):
        self.settings = settings
        self.process = self._new_process(settings)
        self.topic = settings.topic
        self.unreported = Unreported(journal_folder(settings.group_id))
        self._lock = threading.Lock()
        self._rows: list[OutcomeColumns] = []  # rows of what was committed, not yet collected by a slice
        self._tokens: list[int] = []  # the notes (unreported.py) that count those rows
        self._collect_due = False
        self._next_dead_look = 0.0  # when to look for a dead process's file next (monotonic)
        self._error: BaseException | None = None
        self._batch_lock = threading.Lock()
        self._lease = threading.Condition()
        self._lease_until = 0.0
        self._leave = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_rows = time.monotonic()
        # The member's thread's own state (never touched by another thread while it runs).
        self._consumer: Any = None
        self._tasks: dict[int, PartitionTask] = {}
        self._ends: dict[int, int] = {}  # the offset after the last record fed to a partition's task
        self._held: dict[int, deque[Record]] = {}  # polled records waiting for room in their task
        self._held_since: dict[int, float] = {}
        self._paused: set[int] = set()  # paused for flow control
        self._committed_at: dict[int, float] = {}  # when a partition's task last committed (monotonic)
        self._assigned: set[int] = set()
        self._assigned_at = 0.0  # when partitions were last added to the assignment (monotonic)
        self._unleased_paused = False
        self._failing = False

    def _new_process(self, settings: ConsumerSettings) -> WorkerProcess:
        """What the process keeps for the queue (its handler, producers): a subclass's own."""
        return WorkerProcess(settings)

    def _finish_timeout_s(self) -> float:
        """How long leaving may take: every slot's queue of records, each up to the lock."""
        return self.settings.lock_ms / 1000 * self.settings.slot_queue + DELIVERY_TIMEOUT_S

    # -- the slices (a micro-batch task's thread) ------------------------------------------
    def run_batch(self, slice_id: SliceId, final: bool = False) -> list[OutcomeColumns]:
        """Renew the lease for one time slice (the micro-batch task ``slice_id``) and return the
        rows committed meanwhile; ``final`` drains instead: every task finishes and commits, the
        member leaves the group, and the rows of all of it come back."""
        with self._batch_lock:
            self._claim_handed(slice_id)
            self._raise_error()
            if final:
                self._stop_member()
                self._raise_error()
                return self._take(slice_id)
            self._ensure_member()
            self._hold_lease()
            self._raise_error()
            return self._take(slice_id)

    def _claim_handed(self, slice_id: SliceId) -> None:
        """Rows an earlier attempt of this slice had when its process died: counted as skipped."""
        rows = _skipped_rows(self.topic, self.unreported.slice_started(slice_id))
        if rows:
            log.info(
                "%s: %d rows an earlier attempt of this task lost with its process: skipped",
                self.settings.queue,
                len(rows),
            )
            with self._lock:
                self._rows.append(columns_of(rows))

    def _raise_error(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise MemberFailed(f"the group member of {self.settings.queue} failed: {error}") from error

    def _take(self, slice_id: SliceId) -> list[OutcomeColumns]:
        with self._lock:
            rows, self._rows = self._rows, []
            tokens, self._tokens = self._tokens, []
        self.unreported.handed(tokens, slice_id)
        if rows:
            self._last_rows = time.monotonic()
        return rows

    def _holds_rows(self) -> bool:
        with self._lock:
            return bool(self._rows) or self._error is not None

    def _hold_lease(self) -> None:
        """Hold the lease one slice; a member without rows for a while holds it for the idle slice,
        returning as soon as rows come, so an idle queue runs few micro-batches."""
        slice_s = self.settings.batch_ms / 1000
        started = time.monotonic()
        idle = started - self._last_rows >= IDLE_AFTER_S
        until = started + (max(slice_s, self.settings.idle_batch_ms / 1000) if idle else slice_s)
        with self._lease:
            self._lease_until = until + LEASE_GRACE_S
            self._lease.notify_all()
        time.sleep(slice_s)
        if idle:
            with self._lease:
                self._lease.wait_for(self._holds_rows, max(0.0, until - time.monotonic()))
                self._lease_until = time.monotonic() + LEASE_GRACE_S

    def _ensure_member(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._leave.clear()
        with self._lease:  # leased from the start: a member that just joined does not leave at once
            self._lease_until = max(self._lease_until, time.monotonic() + LEASE_GRACE_S)
        self._thread = threading.Thread(target=self._run, name="qp-member", daemon=True)
        self._thread.start()

    def _stop_member(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._lease:
            self._lease_until = 0.0
            self._lease.notify_all()
        self._leave.set()
        thread.join(self._finish_timeout_s())
        if not thread.is_alive():
            self._thread = None

    def leased(self) -> bool:
        return time.monotonic() < self._lease_until

    def _unleased_long(self) -> bool:
        return self._lease_until < time.monotonic() - IDLE_LEAVE_S

    def _rows_added(self, noted: tuple[list[OutcomeColumns], list[int]]) -> None:
        rows, tokens = noted
        if not rows and not tokens:
            return
        with self._lock:
            self._rows.extend(rows)
            self._tokens.extend(tokens)
        with self._lease:
            self._lease.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
        with self._lease:
            self._lease.notify_all()

    # -- the member's thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._consumer = self._join()
        except Exception as exc:  # the next slice fails with it, and the one after joins afresh
            log.error("%s: joining the group failed: %s", self.settings.queue, exc)
            self._fail(exc)
            return
        self._failing = False
        try:
            self._loop()
            self._finish_all()
        except Exception as exc:
            log.error("%s: the group member leaves without committing: %s", self.settings.queue, exc)
            self._failing = True
            self._abandon_all()
            self._fail(exc)
        finally:
            self._close()

    def _join(self) -> Any:
        s = self.settings
        role: dict[str, Any] = {
            "group.id": s.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            # A commit that retention passed resumes at the first record left, whatever
            # startFrom says: startFrom is only for a partition the group never committed
            # (_start_fresh), or "latest" would skip every retained record past the commit.
            "auto.offset.reset": "earliest",
            "session.timeout.ms": kn.MEMBER_SESSION_TIMEOUT_MS,
            "group.protocol": s.group_protocol,
        }
        if s.group_protocol == "consumer":
            del role["session.timeout.ms"]  # the group's consumer.session.timeout.ms rules (plan.py)
        consumer = clients.consumer(s.kafka, role)
        self.process.group = consumer
        self.process.group_metadata = None
        consumer.subscribe([s.topic], on_assign=self._assigned_cb, on_revoke=self._revoked_cb, on_lost=self._lost_cb)
        return consumer

    def _loop(self) -> None:
        consumer = self._consumer
        next_commit = time.monotonic() + COMMIT_S
        while not self._leave.is_set():
            self._raise_if_failing()
            if self._unleased_long():
                return  # no task came for this process: leave, so the group moves its partitions
            leased = self.leased()
            if leased == self._unleased_paused:
                self._pause_for_lease(leased)
            messages = consumer.consume(POLL_RECORDS, POLL_S if self._busy() else IDLE_POLL_S)
            self._raise_if_failed()
            if messages:
                self._take_messages(messages)
            self._feed_held()
            if self._over_uncommitted():
                self._commit_all(force=True)
                next_commit = time.monotonic() + COMMIT_S
            self._collect_if_due()
            now = time.monotonic()
            if now >= next_commit:
                next_commit = now + COMMIT_S
                self._note_group()
                self._commit_all()

    def _busy(self) -> bool:
        """Whether records are held for a task or unfinished in one."""
        return bool(self._held) or any(task.tracker.unfinished for task in self._tasks.values())

    def _raise_if_failing(self) -> None:
        """A rebalance callback failed and dropped what the member held: it must not read or
        commit on (a later commit would pass the dropped records), so it leaves the group."""
        if self._failing:
            raise MemberFailed(f"the group member of {self.settings.queue} failed in a rebalance")

    def _pause_for_lease(self, leased: bool) -> None:
        """Between leases the member reads nothing (its partitions paused), but polls on, so its
        rebalance callbacks run and the group keeps it."""
        consumer = self._consumer
        parts = [TopicPartition(self.topic, p) for p in self._assigned - self._paused]
        if parts:
            if leased:
                consumer.resume(parts)
            else:
                consumer.pause(parts)
        self._unleased_paused = not leased

    def _note_group(self) -> None:
        """The group's metadata for transactions, noted on the consumer's thread, outside callbacks."""
        if self.settings.exactly_once:
            self.process.group_metadata = self._consumer.consumer_group_metadata()

    def _take_messages(self, messages: list[Any]) -> None:
        topic = self.topic
        make = Record.make
        by_partition: dict[int, list[Record]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                if error.fatal():
                    raise KafkaException(error)
                log.warning("%s: the group member's fetch: %s", self.settings.queue, error)
                continue
            partition = message.partition()
            records = by_partition.get(partition)
            if records is None:
                records = by_partition[partition] = []
            headers = message.headers()
            records.append(
                make(
                    message.key(),
                    message.value(),
                    tuple(headers) if headers else (),
                    topic,
                    partition,
                    message.offset(),
                    1,
                    message.timestamp()[1],
                )
            )
        for partition, records in by_partition.items():
            if partition not in self._assigned:
                continue  # revoked since it was fetched: its next owner reads it
            held = self._held.get(partition)
            if held is None:
                held = self._held[partition] = deque()
                self._held_since[partition] = time.monotonic()
            held.extend(records)

    def _limit(self) -> int:
        """The records a partition's task may have taken and not finished: maxInFlight, or few a
        slot while the member holds more than its share (``SETTLE_S``)."""
        s = self.settings
        limit = max(1, s.slot_queue * s.slots)
        if 0 < s.fair_share < len(self._assigned) and time.monotonic() - self._assigned_at < SETTLE_S:
            return min(limit, SETTLING_SLOT_RECORDS * s.slots)
        return limit

    def _feed_held(self) -> None:
        """Hand held records to their tasks while the partition has room under maxInFlight; pause a
        partition whose records waited past ``PAUSE_AFTER_S``, resume it once half are done."""
        limit = self._limit()
        now = time.monotonic()
        for partition in list(self._held):
            held = self._held[partition]
            task = self._task(partition)
            room = limit - task.tracker.unfinished
            bound = self.settings.max_uncommitted
            if bound > 0:
                room = min(room, bound - self._uncommitted())
            if room > 0 and held:
                records = [held.popleft() for _ in range(min(room, len(held)))]
                taken = task.take(records)
                if taken < len(records):  # its busiest slot is full: the rest waits here, first
                    held.extendleft(reversed(records[taken:]))
                if taken:
                    self._ends[partition] = records[taken - 1].offset + 1
                    self._held_since[partition] = now
            if not held:
                del self._held[partition]
                self._held_since.pop(partition, None)
            elif partition not in self._paused and now - self._held_since[partition] >= PAUSE_AFTER_S:
                self._consumer.pause([TopicPartition(self.topic, partition)])
                self._paused.add(partition)
        for partition in list(self._paused):
            owner = self._tasks.get(partition)
            if partition not in self._held and (owner is None or owner.tracker.unfinished <= limit // 2):
                self._paused.discard(partition)
                if partition in self._assigned and not self._unleased_paused:
                    self._consumer.resume([TopicPartition(self.topic, partition)])

    def _task(self, partition: int) -> PartitionTask:
        task = self._tasks.get(partition)
        if task is None:
            task = self._tasks[partition] = PartitionTask(self.process, self.topic, partition, watch_commits=False)
            task.before_commit = self.unreported.committing
        return task

    def _raise_if_failed(self) -> None:
        for task in self._tasks.values():
            task.raise_if_failed()

    def _uncommitted(self) -> int:
        """Records fed to tasks and not committed yet, across the member's partitions (offsets)."""
        total = 0
        for partition, end in self._ends.items():
            task = self._tasks.get(partition)
            if task is None:
                continue
            done = task.last_commit if task.last_commit is not None else task.committed
            total += end - done if done is not None else task.tracker.unfinished
        return total

    def _over_uncommitted(self) -> bool:
        bound = self.settings.max_uncommitted
        return bound > 0 and self._uncommitted() >= bound

    def _commit_all(self, force: bool = False) -> None:
        """Every task's finished prefix, committed now; where nothing is in flight and the position
        passed what was committed (transaction markers, aborted records), the position too, so a
        caught-up queue shows no lag."""
        now = time.monotonic()
        stale = False
        with self._writes_held():
            for partition, task in list(self._tasks.items()):
                if task.commit(None, within_s=QUIET_WAIT_S):
                    self._committed_at[partition] = now
                elif now - self._committed_at.setdefault(partition, now) >= FINISH_AFTER_S:
                    stale = True
                self._rows_added(task.drain_noted())
                self._commit_position(partition, task)
        for partition in self._past_finished():
            self._commit_position(partition, self._task(partition))
        if stale or (force and self._over_uncommitted()):
            self._finish_together()

    def _past_finished(self) -> list[int]:
        """Assigned partitions with no task and no held record that were read past what was
        committed without a record: a transaction's marker, aborted records. Their tasks finished
        together and no record came since, or the member got them already past their last record
        (from a member whose last commit passed only the records). Only a task's commit moves the
        group's offset, so each gets one; without it a caught-up queue shows a lag for good."""
        consumer = self._consumer
        past = []
        for partition in self._assigned:
            if partition in self._tasks or partition in self._held:
                continue
            (position,) = consumer.position([TopicPartition(self.topic, partition)])
            if position.offset < 0:
                continue  # nothing read yet
            end = self._ends.get(partition)
            if end is None:  # never fed here: the group's commit, asked once while it is assigned
                try:
                    committed = self.process.committed(self.topic, partition)
                except KafkaException:
                    continue  # the broker away: asked again at the next commit
                end = self._ends[partition] = committed or 0
            if position.offset > end:
                past.append(partition)
        return past

    def _writes_held(self) -> contextlib.AbstractContextManager[Any]:
        """At least once, the slots' writes wait at the producer's gate while the tasks commit:
        what a commit covers was written before the gate shut and is acknowledged when the
        flush ends (``ServedProducer.writes_held``). exactlyOnce writes go in transactions."""
        if self.settings.exactly_once or not self._tasks:
            return contextlib.nullcontext()
        return self.process.delivery.writes_held(ACK_WAIT_S)

    def _finish_together(self) -> None:
        """For a member whose commits failed for ``FINISH_AFTER_S`` (a flush that did not end within
        ``ACK_WAIT_S``: a slow broker) or that is over ``max_uncommitted``: the tasks finish together
        (their slots drain, the producer goes quiet, every task commits), and the next records
        start new ones."""
        now = time.monotonic()
        for partition in list(self._tasks):
            task = self._tasks.pop(partition)
            end = self._ends.get(partition)
            try:
                if end is None:
                    self._end_idle(task)
                else:
                    task.finish(end)
            finally:
                self._rows_added(task.drain_noted())
            self._committed_at[partition] = now

    def _commit_position(self, partition: int, task: PartitionTask) -> None:
        if partition in self._held or task.tracker.unfinished:
            return
        end = self._ends.get(partition)
        if end is not None and (task.last_commit is None or task.last_commit < end):
            return  # fed records not yet committed: their own commit comes first
        (position,) = self._consumer.position([TopicPartition(self.topic, partition)])
        offset = position.offset
        if offset == OFFSET_INVALID or offset < 0:
            return
        if task.last_commit is not None and offset <= task.last_commit:
            return
        if task.last_commit is None and task.committed is not None and offset <= task.committed:
            return
        mark = TopicPartition(self.topic, partition, offset)
        if task.writer is not None:
            task.writer.commit([], mark, lambda _entry, _why: None)
        else:
            self.process.commit(self.topic, partition, offset)
        task.last_commit = offset
        self._ends[partition] = offset

    def _finish(self, partition: int) -> None:
        """A partition leaves this member: its held records are dropped (never fed, never
        committed), its task finishes (slots idle, outputs durable, offsets committed)."""
        self._held.pop(partition, None)
        self._held_since.pop(partition, None)
        self._paused.discard(partition)
        task = self._tasks.pop(partition, None)
        end = self._ends.pop(partition, None)
        if task is None:
            return
        try:
            if end is None:
                self._end_idle(task)  # nothing fed: nothing to commit
            else:
                task.finish(end)
        finally:
            self._rows_added(task.drain_noted())

    @staticmethod
    def _end_idle(task: PartitionTask) -> None:
        task.abandon()
        if task.writer is not None:
            task.writer.close()

    def _finish_all(self) -> None:
        for partition in list(self._tasks):
            self._finish(partition)

    def _abandon_all(self) -> None:
        for task in self._tasks.values():
            task.abandon()
            self._rows_added(task.drain_noted())  # committed before the failure: their rows stand
            if task.writer is not None:
                task.writer.close()
        self._tasks.clear()
        self._held.clear()
        self._held_since.clear()
        self._ends.clear()
        self._paused.clear()

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._assigned.clear()
        self._unleased_paused = False
        if consumer is not None:
            try:
                consumer.close()  # leaves the group; the revocation finishes nothing while failing
            except Exception as exc:
                log.warning("%s: closing the group member: %s", self.settings.queue, exc)

    # -- rebalance callbacks (on the member's thread, inside a poll) -----------------------
    def _collect_if_due(self) -> None:
        """Collect at an assignment, and whenever a dead process's file is seen (looked for once
        a commit interval): the run may end before its partitions are given to anyone."""
        now = time.monotonic()
        if not self._collect_due and now >= self._next_dead_look:
            self._next_dead_look = now + COMMIT_S
            self._collect_due = self.unreported.dead_left()
        if self._collect_due:
            self._collect_unreported()

    def _collect_unreported(self) -> None:
        """Rows a dead process committed and never reported: counted as skipped (unreported.py)."""
        self._collect_due = False
        found = self.unreported.collect(lambda parts: fetch_committed(self._consumer, self.topic, parts))
        rows = _skipped_rows(self.topic, found)
        if rows:
            log.info("%s: %d rows a dead process committed and never reported: skipped", self.settings.queue, len(rows))
            self._rows_added(([columns_of(rows)], []))

    def _assigned_cb(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.process.journal.collect()  # a process that died in a call of these partitions
        self._collect_due = True
        self._assigned.update(tp.partition for tp in partitions)
        self._assigned_at = time.monotonic()
        if self.settings.exactly_once:
            # Each partition's producer first: its init_transactions fences the one an earlier
            # owner left (a dead process, or a live one whose commit timed out in an outage) and
            # aborts its open transaction. Until then the group's offsets for the partition are
            # unstable, and every read of them (the consumer's own fetch position, committed())
            # waits: for the old transaction's timeout at best, for good while its zombie lives.
            for tp in partitions:
                self._task(tp.partition)
        placed = self._start_fresh(consumer, partitions)
        if (self._unleased_paused or placed) and partitions:
            consumer.incremental_assign(partitions) if self._cooperative() else consumer.assign(partitions)
            if self._unleased_paused:
                consumer.pause(partitions)

    def _start_fresh(self, consumer: Any, partitions: list[TopicPartition]) -> bool:
        """``startFrom: latest``: the partitions the group never committed start at their end
        (their offset set in place); whether any did. The others resume at their commit."""
        if self.settings.start_from != "latest" or not partitions:
            return False
        committed = consumer.committed([TopicPartition(tp.topic, tp.partition) for tp in partitions], timeout=30)
        # A partition whose commit could not be read is not taken for a new one: resuming at
        # the start costs duplicates, the end would skip records.
        fresh = {tp.partition for tp in committed if tp.offset < 0 and tp.error is None}
        for tp in partitions:
            if tp.partition in fresh:
                tp.offset = OFFSET_END
        return bool(fresh)

    def _cooperative(self) -> bool:
        return self.settings.group_protocol == "consumer"

    def _revoked_cb(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._assigned.discard(tp.partition)
        if self._failing:
            return
        try:
            for tp in partitions:
                self._finish(tp.partition)
        except Exception as exc:
            log.error("%s: finishing revoked partitions failed: %s", self.settings.queue, exc)
            self._failing = True
            self._abandon_all()
            self._fail(exc)

    def _lost_cb(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """The group gave the partitions to others already: nothing of theirs may be committed."""
        for tp in partitions:
            self._assigned.discard(tp.partition)
            self._held.pop(tp.partition, None)
            self._paused.discard(tp.partition)
            self._ends.pop(tp.partition, None)
            task = self._tasks.pop(tp.partition, None)
            if task is not None:
                task.abandon()
                self._rows_added(task.drain_noted())
                if task.writer is not None:
                    task.writer.close()

    def close(self) -> None:
        self._stop_member()
        self.process.close()
        self.unreported.close()


def _skipped_rows(topic: str, ranges: list[Range]) -> list[Outcome]:
    return [
        Outcome(topic, partition, max(first, 0) + i, None, 1, SKIPPED, None, 0.0, 0)
        for partition, first, _end, count in ranges
        for i in range(count)
    ]


MEMBERS: PerProcess[GroupMember] = PerProcess(lambda text: GroupMember(ConsumerSettings.from_json(text)))
