"""The kmq redelivery tracker: a thread on the driver reading the markers topic with its own consumer.

It keeps the open deliveries in memory (``OpenDeliveries``): per message, its delivery count,
its deadline (start + ``lockDuration``, or a retry marker's time + its backoff) and where the
marker that set them sits. An ``end`` marker closes a delivery; a deadline that passes first
hands it to the ``Redeliverer``, which produces the message again (or to the DLQ) and writes
the timed-out delivery's ``expired`` marker, which closes it too. A ``release`` marker makes an
open delivery due at once and uncounted: no call was tried, so its copy keeps its count and
never goes to the DLQ for it. A network fault or a loaded machine that keeps a task from
starting its records in time would otherwise spend their deliveries without a call.

The markers are the state. The tracker commits, in its own group on the markers topic, for
each partition the offset of the oldest marker that still holds an open delivery (the position
it has read to when none is open). A tracker that starts reads on from there and so rebuilds
every delivery left open, as kmq's own tracker does; a group that never committed reads every
retained marker. A crash between a redelivery and its ``end`` marker redelivers that message
once more after the restart, a duplicate at worst.

Why a thread and not a Spark query: a ``transformWithState`` query over the markers cost about
0.26 ms of CPU a message measured alone (its shuffle, its state store, each marker's round trip
to a Python worker) and started a Python process outside Spark's daemon; read by one consumer
and folded in a dict, a message costs the driver about 10 µs, its consumer's threads included
(docs/design/kmq-tracker.md).

A broker outage never ends the tracker. Each call it makes to Kafka (the markers topic's
partitions, where its partitions end, a redelivery round) that fails is tried again after a
pause that grows to RETRY_MAX_S, with a warning line at most once a minute (``Faults``);
while one fails, ``degraded`` says which, and the worker's readiness shows it. Deliveries that
fall due meanwhile are redelivered once the broker answers again; nothing is ended unread.
A consumer whose calls keep failing for NEW_CLIENT_AFTER_S is closed and a new one reads on
from the positions read to: after a broker restart, a librdkafka consumer with assigned
partitions was seen to fail every call for minutes ("Broker transport failure", "Unknown
partition") while the worker's other clients answered again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.offsets import committed_positions
from queueplane.kafka.target import KafkaTarget
from queueplane.run.kmq import markers as km
from queueplane.run.kmq.redeliverer import GIVE_UP, REDELIVER, Expired

log = logging.getLogger("queueplane.worker")

READ_AT_ONCE = 5000  # markers one consume call returns at most
STEP_S = 0.1  # how often it looks for deadlines passed (a scan of the open deliveries)
# Past a deadline the tracker waits for a late end marker (markers.LATE_END_SHARE) and for the
# moment it takes to be written and acknowledged under load, then reads every marker written
# until then (its partitions' ends, asked of the broker) before it redelivers.
LATE_END_MARGIN_MS = 1000
COMMIT_EVERY_S = 1.0
LAST_COMMIT_WAIT_S = 5.0
METADATA_EVERY_S = 30.0  # how often it looks for partitions added to the markers topic
# A call to Kafka that fails (the broker away) is tried again after a pause that grows, as long
# as it takes: the worker stays up, not ready, and goes on once the broker answers.
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
WARN_EVERY_S = 60.0
# Longer than a broker restart takes, so a new client is made only where the old one stays
# broken (at most once per this long while the broker is away; a new one is harmless then).
NEW_CLIENT_AFTER_S = 60.0


def redelivery_grace_ms(lock_ms: int) -> int:
    """How long past its deadline a delivery is redelivered: what an end marker may be late by."""
    return int(lock_ms * km.LATE_END_SHARE) + LATE_END_MARGIN_MS


class Faults:
    """One kind of call the tracker makes to Kafka while it fails: when to try it again, when to
    say so in a line, and why the worker is degraded meanwhile. No I/O; the clock is passed in.

    The first failure is logged at once, then at most one line every WARN_EVERY_S with the count
    since; the pause before the next try doubles from RETRY_FIRST_S up to RETRY_MAX_S. The first
    success after failures logs how long they lasted and resets the pause.
    """

    def __init__(self, what: str):
        self.what = what
        self.since: float | None = None  # when the failures began
        self.error = ""
        self.retry_at = float("-inf")
        self.pause_s = RETRY_FIRST_S
        self._logged_at = float("-inf")
        self._failures = 0  # since the last line

    def due(self, now: float) -> bool:
        """Whether the call may be tried at ``now`` (always, unless it is waiting out a pause)."""
        return now >= self.retry_at

    def failed(self, now: float, exc: BaseException) -> None:
        first = self.since is None
        self.since = now if first else self.since
        self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self._failures += 1
        pause = self.pause_s
        self.retry_at, self.pause_s = now + pause, min(RETRY_MAX_S, pause * 2)
        if first or now - self._logged_at >= WARN_EVERY_S:
            assert self.since is not None
            log.warning(
                "kmq tracker: %s failed (%s), %d time(s) in %.0fs; the worker stays up and tries again in %.0fs",
                self.what,
                self.error,
                self._failures,
                now - self.since,
                pause,
            )
            self._logged_at, self._failures = now, 0

    def answered(self, now: float) -> None:
        if self.since is not None:
            log.info("kmq tracker: %s works again, after %.0fs of failures", self.what, now - self.since)
        self.since, self.retry_at, self.pause_s, self._failures = None, float("-inf"), RETRY_FIRST_S, 0
        self._logged_at = float("-inf")

    def degraded(self, now: float) -> str | None:
        """Why the worker is degraded by this call, while it fails; else None."""
        if self.since is None:
            return None
        return f"kmq tracker: {self.what} has failed for {now - self.since:.0f}s: {self.error}"


class OpenDelivery(NamedTuple):
    delivery_count: int
    due_ms: int
    # The marker that opened it (start) or moved its deadline (retry): a restart reads from here.
    marker_partition: int
    marker_offset: int
    # False once a ``release`` said no call was tried: its copy keeps this delivery's count.
    counted: bool = True


class OpenDeliveries:
    """The deliveries the markers read so far leave open, by (queue partition, offset). No I/O."""

    def __init__(self, lock_ms: int, delivery_limit: int):
        self.lock_ms, self.delivery_limit = lock_ms, delivery_limit
        self.open: dict[tuple[int, int], OpenDelivery] = {}

    def fold_run(self, run: km.MarkerRun, marker_partition: int, marker_offset: int) -> None:
        """One marker record's markers, in the order of its markers partition (a message's markers
        all share one); they share all but their offsets, and so one OpenDelivery."""
        p, deliveries = run.partition, self.open
        if run.kind in km.ENDS:
            for offset in run.offsets:
                deliveries.pop((p, offset), None)
            return
        if run.kind == km.RELEASE:  # only the delivery it is about, if still open: due at once, not counted
            for offset in run.offsets:
                open_ = deliveries.get((p, offset))
                if open_ is not None and open_.delivery_count == run.delivery_count:
                    deliveries[(p, offset)] = open_._replace(due_ms=min(open_.due_ms, run.at_ms), counted=False)
            return
        if run.kind not in (km.START, km.RETRY):
            return
        due = run.at_ms + (self.lock_ms if run.kind == km.START else run.delay_ms)
        delivery = OpenDelivery(run.delivery_count, due, marker_partition, marker_offset)
        for offset in run.offsets:
            deliveries[(p, offset)] = delivery

    def due(self, now_ms: int) -> list[Expired]:
        """The deliveries whose deadline has passed, oldest deadline first (still open until ``ended``)."""
        late = sorted(
            (d.due_ms, key, d.delivery_count, d.counted) for key, d in self.open.items() if d.due_ms <= now_ms
        )
        return [
            Expired(p, o, count, GIVE_UP if counted and count >= self.delivery_limit else REDELIVER, counted)
            for _due, (p, o), count, counted in late
        ]

    def ended(self, expired: Iterable[Expired]) -> None:
        """Redelivered or dead-lettered: their ``end`` markers are written, and need not be read first."""
        for item in expired:
            self.open.pop((item.partition, item.offset), None)

    def restart_points(self, positions: dict[int, int]) -> dict[int, int]:
        """Per markers partition read so far, where a restarted tracker must read from: its oldest
        marker holding an open delivery, else the position read to."""
        points = dict(positions)
        for delivery in self.open.values():
            p = delivery.marker_partition
            if p in points and delivery.marker_offset < points[p]:
                points[p] = delivery.marker_offset
        return points


class Tracker:
    """The thread: read markers, fold them, redeliver what is due, commit where a restart reads from.

    ``redeliver`` is the ``Redeliverer``'s ``handle``: it returns what it redelivered or
    dead-lettered, and raises when it could not (nothing of that round is ended then).
    ``on_done`` gets each round's result on this thread (the runtime counts them).
    """

    def __init__(
        self,
        target: KafkaTarget,
        group_id: str,
        markers_topic: str,
        deliveries: OpenDeliveries,
        redeliver: Callable[[list[Expired]], list],
        on_done: Callable[[list], None],
        make_consumer: Callable[[dict[str, Any]], Consumer] | None = None,
    ):
        self.target, self.group, self.topic = target, kn.kmq_tracker_group(group_id), markers_topic
        self._make_consumer = make_consumer or (lambda config: clients.consumer(target.settings, config))
        self.deliveries = deliveries
        self.redeliver, self.on_done = redeliver, on_done
        self.grace_ms = redelivery_grace_ms(deliveries.lock_ms)
        # (cutoff ms, markers partition ends): deliveries due by the cutoff go once these are read
        self._fence: tuple[int, dict[int, int]] | None = None
        self.positions: dict[int, int] = {}  # per markers partition, the next offset to read
        self.expected: dict[int, int] = {}  # markers the tracker must have read before it can be idle
        self.failure: BaseException | None = None
        # Where the markers partitions ended when the worker started, read on this thread: until
        # it is, the tracker cannot be idle (a delivery a run before this one left open may be there).
        self._ends_reader: Callable[[], dict[int, int]] | None = None
        self.metadata_faults = Faults("reading the partitions of the markers topic")
        self.ends_faults = Faults("reading where the markers partitions end")
        self.round_faults = Faults("redelivering the deliveries due")
        self._committed: dict[int, int] = {}
        self._commit_in_flight: dict[int, int] | None = None
        self._warned: dict[int, float] = {}  # per error code, when a read error was last logged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qp-kmq-tracker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def expect_from(self, read_ends: Callable[[], dict[int, int]]) -> None:
        """``expect`` what ``read_ends`` answers, asked on the tracker's thread until it answers."""
        self._ends_reader = read_ends

    def degraded(self) -> str | None:
        """Why the tracker cannot do all its work now (the broker away), or None."""
        now = time.monotonic()
        reasons = [f.degraded(now) for f in (self.metadata_faults, self.ends_faults, self.round_faults)]
        return "; ".join(r for r in reasons if r) or None

    def expect(self, ends: dict[int, int]) -> None:
        """Markers up to ``ends`` exist (after a worker batch, or at the start): read them before idle."""
        for partition, end in ends.items():
            self.expected[partition] = max(end, self.expected.get(partition, 0))

    def idle(self) -> bool:
        """Nothing open, and every marker written before the last ``expect`` read."""
        if self._ends_reader is not None:
            return False
        positions = self.positions
        caught_up = all(positions.get(p, -1) >= end for p, end in list(self.expected.items()))
        return caught_up and not self.deliveries.open

    # -- the thread ---------------------------------------------------------------------------
    def _new_consumer(self) -> Consumer:
        return self._make_consumer(
            {
                "group.id": self.group,
                "enable.auto.commit": False,
                "enable.partition.eof": True,  # an end of partition says where "read to the end" is
                "auto.offset.reset": "earliest",  # never committed: every retained marker
                "on_commit": self._on_commit,
            }
        )

    def _broken_for(self, now: float) -> float:
        """How long the consumer's own calls (metadata, redelivery rounds) have failed without a break."""
        since = [f.since for f in (self.metadata_faults, self.round_faults) if f.since is not None]
        return now - min(since) if since else 0.0

    def _replace(self, consumer: Consumer, now: float) -> Consumer:
        """A new consumer for one whose calls keep failing; it is assigned (``_assign``) at the
        positions read to, and whatever waited on the old one (a commit, a round's fence) is
        asked of the new one at once."""
        log.warning(
            "kmq tracker: its consumer's calls have failed for %.0fs; a new consumer reads on from where it was",
            self._broken_for(now),
        )
        with contextlib.suppress(Exception):
            consumer.close()
        self._commit_in_flight, self._fence = None, None
        self.metadata_faults.retry_at = self.round_faults.retry_at = float("-inf")
        return self._new_consumer()

    def _run(self) -> None:
        consumer: Consumer | None = None
        try:
            consumer = self._new_consumer()
            made_at = time.monotonic()
            assigned: set[int] = set()
            metadata_at = 0.0
            commit_at = time.monotonic() + COMMIT_EVERY_S
            expire_at = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if self._broken_for(now) >= NEW_CLIENT_AFTER_S and now - made_at >= NEW_CLIENT_AFTER_S:
                    consumer = self._replace(consumer, now)
                    made_at, assigned, metadata_at = time.monotonic(), set(), 0.0
                if self._ends_reader is not None and self.ends_faults.due(now):
                    self._read_ends(self._ends_reader, now)
                if now >= metadata_at and self.metadata_faults.due(now):
                    try:
                        assigned = self._assign(consumer, assigned)
                    except Exception as exc:  # the broker away: what is assigned is read on, and asked again
                        self.metadata_faults.failed(now, exc)
                    else:
                        self.metadata_faults.answered(now)
                        metadata_at = now + METADATA_EVERY_S
                for message in consumer.consume(READ_AT_ONCE, STEP_S):
                    self._read(message)
                if time.monotonic() >= expire_at:
                    self._expire(consumer)
                    expire_at = time.monotonic() + STEP_S
                if time.monotonic() >= commit_at:
                    self._commit(consumer)
                    commit_at = time.monotonic() + COMMIT_EVERY_S
            self._last_commit(consumer)
        except BaseException as exc:  # not Kafka's (those are ridden out): the run ends on it (KmqRuntime.failed)
            log.error("kmq: the redelivery tracker stopped: %s", exc, exc_info=True)
            self.failure = exc
        finally:
            if consumer is not None:
                with contextlib.suppress(Exception):
                    consumer.close()

    def _read_ends(self, read_ends: Callable[[], dict[int, int]], now: float) -> None:
        try:
            ends = read_ends()
        except Exception as exc:  # the broker away: asked again after a pause, and not idle until then
            self.ends_faults.failed(now, exc)
            return
        self.ends_faults.answered(now)
        self.expect(ends)
        self._ends_reader = None

    def _assign(self, consumer: Consumer, assigned: set[int]) -> set[int]:
        """Every partition of the markers topic, each from the group's committed offset; raises
        when the broker does not answer (those assigned are read on).

        The committed offsets are read here and given with the assignment: a partition assigned
        without one waits on the client's own offset fetch, and one that failed as the broker
        came back (NOT_COORDINATOR while its coordinator loaded) left the partition unread.
        """
        metadata = consumer.list_topics(self.topic, timeout=10)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise KafkaException(topic.error if topic is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        new = set(topic.partitions) - assigned
        if new:
            unread = sorted(p for p in new if p not in self.positions)
            committed = committed_positions(consumer, self.topic, unread) if unread else []
            start = [
                TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                for tp in committed
            ]
            # A new consumer (the last one broken) reads on from where the tracker has read to.
            start += [TopicPartition(self.topic, p, self.positions[p]) for p in sorted(new - set(unread))]
            consumer.incremental_assign(start)
        return assigned | new

    def _read(self, message: object) -> None:
        error = message.error()  # type: ignore[attr-defined]
        partition, offset = message.partition(), message.offset()  # type: ignore[attr-defined]
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self.positions[partition] = offset
            elif time.monotonic() - self._warned.get(error.code(), -WARN_EVERY_S) >= WARN_EVERY_S:
                self._warned[error.code()] = time.monotonic()  # the client retries: a line a minute per kind
                log.warning("kmq tracker: reading %s failed: %s", self.topic, error)
            return
        self.positions[partition] = offset + 1
        key = message.key()  # type: ignore[attr-defined]
        if key is None or km.is_tick(key):  # ticks of an earlier version: no delivery
            return
        try:
            run = km.decode_run(key, message.value())  # type: ignore[attr-defined]
        except ValueError as exc:
            log.warning("kmq tracker: %s[%s]@%s is not a marker (%s); skipped", self.topic, partition, offset, exc)
            return
        self.deliveries.fold_run(run, partition, offset)

    def _expire(self, consumer: Consumer) -> None:
        """Redeliver what is due past its grace, once every marker written until then is read."""
        now = time.monotonic()
        if not self.round_faults.due(now):
            return
        try:
            expired = self._due(consumer)
            if not expired:
                if self._fence is None:  # nothing due (end markers closed what a failed round had): nothing fails
                    self.round_faults.answered(now)
                return
            done = self.redeliver(expired)
        except Exception as exc:  # the broker away: the same deliveries again after a pause, however long
            self._fence = None
            self.round_faults.failed(now, exc)
            return
        self.round_faults.answered(now)
        self.deliveries.ended(expired)
        self.on_done(done)

    def _due(self, consumer: Consumer) -> list[Expired]:
        """What is due, past its grace, as of a moment up to which every marker has been read."""
        if self._fence is None:
            cutoff = int(time.time() * 1000) - self.grace_ms
            late = self.deliveries.due(cutoff)
            if not late:
                return []
            partitions = sorted({self.deliveries.open[(e.partition, e.offset)].marker_partition for e in late})
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10, cached=False)[1]
                for p in partitions
            }
            self._fence = (cutoff, ends)
        cutoff, ends = self._fence
        if any(self.positions.get(p, -1) < end for p, end in ends.items()):
            return []  # an end marker written before the cutoff may still be on its way here
        self._fence = None
        return self.deliveries.due(cutoff)

    def _commit(self, consumer: Consumer) -> None:
        """Commit where a restart reads from, asynchronously: a synchronous commit waits as long as
        the broker is away, and the tracker with it. One commit at a time; ``_committed`` moves
        when the broker confirms it (``_on_commit``, called from ``consume``)."""
        if self._commit_in_flight is not None:
            return
        points = self.deliveries.restart_points(self.positions)
        changed = {p: o for p, o in points.items() if self._committed.get(p) != o}
        if not changed:
            return
        try:
            consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(changed.items())], asynchronous=True
            )
        except Exception as exc:  # the next commit carries it; until then a restart reads more markers again
            log.warning("kmq tracker: committing its markers position failed: %s", exc)
            return
        self._commit_in_flight = changed

    def _on_commit(self, error: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        changed, self._commit_in_flight = self._commit_in_flight, None
        if error is not None:  # the next commit carries it; until then a restart reads more markers again
            log.info("kmq tracker: committing its markers position failed: %s", error)
        elif changed is not None:
            self._committed.update(changed)

    def _last_commit(self, consumer: Consumer) -> None:
        """The position at stop, waited for a few seconds (the broker may be away: then not)."""
        deadline = time.monotonic() + LAST_COMMIT_WAIT_S
        while time.monotonic() < deadline:
            self._commit(consumer)
            if self._commit_in_flight is None:
                return  # nothing left to commit
            consumer.consume(READ_AT_ONCE, STEP_S)  # serves the commit's callback; markers read now are not folded
