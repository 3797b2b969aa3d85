"""A share-group fetcher: one ShareConsumer polling, acknowledging and committing in its own thread.

A write reported refused (an output, a dead letter, a parked copy) shared its record batch with
others, and the broker refuses a batch whole: it is written again alone (queueplane.run.executor.failed_writes)
before its record is dead-lettered or its dead letter parked; taken alone, it is a success.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from confluent_kafka import AcknowledgeType, KafkaException, Message

from queueplane.handler_api import InvalidOutput, Record
from queueplane.kafka import clients
from queueplane.kafka.consumed import headers_of, offset_of, partition_of
from queueplane.run.dead_letters import Failure, failure_of_headers
from queueplane.run.executor.call_guard import CallGuard
from queueplane.run.executor.crash_journal import CrashJournal, worker_died
from queueplane.run.executor.failed_writes import alone_writes
from queueplane.run.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    DELIVERY_TIMEOUT_S,
    RELEASED,
    Outcome,
    OutcomeColumns,
    ProducedRecord,
    accepted_columns,
    columns_of,
    dead_letter_record,
    is_parked,
    parked_record,
    unparked_dead_letter,
)
from queueplane.run.parking import LOST, PARKED, REFUSALS, RETRYING, cause_of, refused_failure
from queueplane.run.share.executor.accepted import AcceptedLately
from queueplane.run.share.executor.outbox import Outbox, Unrecorded
from queueplane.run.share.executor.pool import SUSPECT, Chunk, HandlerPool, Poll
from queueplane.run.share.executor.queue_end import QueueEnd
from queueplane.run.share.settings import (
    ACCEPTED_RESULT,
    ACK_EVERY_S,
    ALREADY_COUNTED_RESULT,
    ALREADY_DEAD_RESULT,
    DRAIN_POLL_MAX_S,
    DRAIN_POLL_S,
    FETCH_WAIT_MS,
    HANDLER_SHARE_OF_LOCK,
    STUCK_S,
    Result,
    ShareSettings,
)

log = logging.getLogger("queueplane.worker")

RESERVE_FAILURE = Failure(
    "DeliveryLimitReached", "its last allowed delivery ended without an outcome (worker stopped or lock ran out)"
)
PARK_PAUSE_S = 1.0  # a fetcher's pause after parking: the DLQ refuses writes, retrying at once would spin
# A record on its last delivery whose DLQ write and parking both failed: both are tried again,
# after these pauses (doubling), until this much of its lock is left for the acknowledgements.
PARK_RETRY_S = 0.5
PARK_RETRY_MAX_S = 4.0
HOLD_MARGIN_S = 2.0
HOLD_MARGIN_SHARE = 0.1
COMMIT_TIMEOUT_S = 60.0  # commit_sync's own default, stated: the call guard bounds the call by it
# close() takes no timeout: librdkafka bounds its last commit and the group's leave by socket.timeout.ms.
CLOSE_TIMEOUT_S = 60.0


def reserve_failure(partition: int, offset: int, headers: list, journal: CrashJournal) -> Failure:
    """The DLQ's error for a record on a reserve delivery; a parked one keeps its own."""
    if is_parked(headers):
        return failure_of_headers(headers)
    key = (partition, offset)
    crashes = journal.crashes.get(key)
    if crashes is None:
        return RESERVE_FAILURE
    if key in journal.died_alone:
        return worker_died(crashes, journal.reasons.get(key))
    # Its process died with other calls running, and it never ran alone after: the death may
    # be another record's, so its class says only that its deliveries ran out.
    return Failure(
        RESERVE_FAILURE.error_class,
        f"its last allowed delivery ended without an outcome: its process died {crashes} time(s) "
        "while this record was in a call beside others",
    )


class FetcherHost(Protocol):
    """What a fetcher needs of its process: the settings, the pool, the crash journal, the outbox,
    the records accepted lately, the call guard, the lease, the producer, and when a poll of any
    of its fetchers last brought records and when the queue's topic last grew (a drain waits on
    both)."""

    settings: ShareSettings
    pool: HandlerPool
    journal: CrashJournal
    outbox: Outbox
    accepted: AcceptedLately
    calls: CallGuard
    records_polled_at: float
    queue_end: QueueEnd

    def leased(self) -> bool: ...

    def enter_cycle(self, fetcher: ShareFetcher) -> bool: ...

    def unleased_long(self) -> bool: ...

    def leave_cycle(self, fetcher: ShareFetcher, outcomes: list[OutcomeColumns]) -> None: ...

    def settle(self, token: int, unrecorded: Unrecorded) -> None: ...

    def first_attempt(self, record: Record, now_ms: int) -> int: ...

    def produce_and_wait(self, records: list[ProducedRecord]) -> None: ...


class InOrder:
    """A poll's records by partition in offset order, and how far each partition's acknowledged run reaches.

    Records acknowledged while their poll runs are each partition's accepted run from its first
    record, never a record after one still running: the broker persists what is acknowledged,
    and with acknowledgements scattered through a batch, a broker restarted mid-run (Kafka 4.3.1
    and 4.4.0) read back share partitions it then never delivered from again (docs/runtimes.md).
    """

    def __init__(self, messages: list[Message]):
        self.size = len(messages)
        self.counted = False  # a record counted already (ALREADY_COUNTED_RESULT) was among the accepted
        self.runs: dict[int, list[int]] = {}
        for i, message in enumerate(messages):
            self.runs.setdefault(cast(int, message.partition()), []).append(i)  # polled: it has one
        self.reached = dict.fromkeys(self.runs, 0)
        self.given = False  # the poll's last acknowledgements (of every record left) were given

    def accepted(self, results: list[Result | None]) -> list[int]:
        """The records accepted since the last call that extend their partition's run (with those
        to accept that were counted already, which then sets ``counted``)."""
        ready: list[int] = []
        for partition, run in self.runs.items():
            at = self.reached[partition]
            while at < len(run):
                result = results[run[at]]
                if result is not ACCEPTED_RESULT:
                    if result is not ALREADY_COUNTED_RESULT:
                        break
                    self.counted = True
                ready.append(run[at])
                at += 1
            self.reached[partition] = at
        return ready

    def left(self) -> list[int]:
        """The records not yet acknowledged, in poll order."""
        if not any(self.reached.values()):
            return list(range(self.size))
        return sorted(i for partition, run in self.runs.items() for i in run[self.reached[partition] :])


class ShareFetcher:
    """A ShareConsumer in explicit acknowledgement mode feeding the process's handler pool.

    Its thread hands every record of a poll to the pool at once, so one slow record does
    not hold up the others locked by the same poll, and acknowledges each as soon as its
    outcome is durable; acknowledgements ride on the next poll, or are committed when the
    lease ends or time runs short.
    """

    def __init__(self, host: FetcherHost, index: int):
        self.host = host
        self.index = index
        s = host.settings
        self.consumer = clients.share_consumer(
            s.kafka,
            {
                "group.id": s.group_id,
                "share.acknowledgement.mode": "explicit",
                "max.poll.records": s.max_poll_records,
                # The longest a fetch waits on the broker for records. Acknowledgements committed
                # meanwhile wait for it (measured: commits of 0.5-0.7 s at the default 500 ms), and
                # while they wait a killed worker's handled records come back as duplicates.
                "fetch.wait.max.ms": FETCH_WAIT_MS,
                "client.id": f"queueplane-{s.queue}-{os.getpid()}-{index}",
            },
        )
        self.consumer.subscribe([s.topic])
        self.alone = alone_writes(s.kafka)  # suspects written again, each in a batch of its own
        self.busy = False
        self.pending = False  # acknowledgements not yet committed
        self.parked = False  # this poll parked a dead letter the DLQ refused
        # librdkafka sends a share fetch only from a poll that finds nothing buffered, and one poll
        # returns a whole fetch response. So after a poll that brought records this consumer holds
        # nothing unhandled; after an empty one its fetch is still out, and what that fetch
        # acquires arrives after the poll (a consumer closed then hands it back one delivery higher).
        self._fetch_out = False
        # Draining: leaves the group (``left``) once it holds nothing unhandled: at once, or after a
        # poll that brought records, or when the drain's time is up (an idle queue: a fetch that
        # is out finds nothing to acquire).
        self.draining = False
        self._drain_started = 0.0
        self.left = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"qp-fetch-{index}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed:
            if not self.host.enter_cycle(self):
                if self.host.unleased_long() and not self.draining:
                    log.info("share fetcher %d: no task came for this process; leaving the group", self.index)
                    self.drain()  # no batch came for this process: let go of the group
                continue
            outcomes: list[OutcomeColumns] = []
            try:
                if self.draining and self._may_leave():
                    if self._fetch_out:
                        log.info(
                            "share fetcher %d: leaving the group after %.1f s of empty polls, a fetch still out",
                            self.index,
                            time.monotonic() - self._drain_started,
                        )
                    self._leave()
                elif self.host.leased() or self.draining:
                    self._cycle(outcomes)
                if self.pending and not self.host.leased():
                    # The lease ended: nothing stays uncommitted. A failed commit is not retried
                    # forever; the broker redelivers whatever it did not record.
                    self._commit()
                    self.pending = False
            except Exception:  # a fetcher thread must outlive any one bad poll
                log.exception("share fetcher %d failed a poll; continuing", self.index)
                time.sleep(0.2)
            finally:
                self.host.leave_cycle(self, outcomes)  # after ``left``: a drain waits for it

    def _cycle(self, outcomes: list[OutcomeColumns]) -> None:
        """One poll: hand its records to the pool, settle them together, acknowledge each."""
        if not self.host.pool.wait_for_room(0.05):
            if self.pending:  # acknowledgements must not wait for the pool: their records' locks run
                self.pending = not self._commit()
            return
        try:
            messages = self.consumer.poll(0.2)
        except KafkaException as exc:
            log.warning("share poll failed: %s", exc)
            time.sleep(0.2)
            return
        polled_at = time.monotonic()
        self._fetch_out = not messages
        good = [m for m in messages if not m.error()]
        if good:
            self.host.records_polled_at = polled_at
        if len(good) < len(messages):
            for m in messages:
                if m.error():
                    log.warning("share consumer error: %s", m.error())
        if not good:
            return
        lock_s = self.host.settings.lock_ms / 1000
        # A handler gets 70% of the lock; the rest is for outputs, the DLQ and the acknowledgement.
        pool = self.host.pool
        in_order = InOrder(good)
        poll: Poll | None = None
        try:
            poll = Poll(good, polled_at + lock_s * HANDLER_SHARE_OF_LOCK)
            calls, suspects = self._calls(good, poll)
            chunks = pool.submit(poll, calls, pool.chunk_size(len(calls)))
            if suspects:
                chunks += pool.submit(poll, suspects, isolated=True)
            self._await(poll, chunks, lambda: self._acknowledge_accepted(good, poll, polled_at, in_order))
            self.parked = False
            if poll.suspects:
                self._confirm_suspects(poll)
            self._acknowledge(good, poll, polled_at, outcomes, in_order)
        except BaseException:
            self._release_unacknowledged(good, poll, in_order)
            raise
        self.pending = True
        if time.monotonic() - polled_at > lock_s / 2 or self.parked:
            self.pending = not self._commit()
        if self.parked:  # the DLQ refuses writes: parked records must not cycle through at full speed
            time.sleep(PARK_PAUSE_S)

    def _calls(self, messages: list[Message], poll: Poll) -> tuple[Sequence[int], list[int]]:
        """The records of a poll that go to the handler, and the suspects among them, which are
        called in a child process each; the others get their result here.

        A record past deliveryLimit is on one of the broker's reserve deliveries: its last allowed
        delivery ended without an outcome (the worker was killed, its lock ran out), and the
        handler had its deliveries, so it goes to the DLQ (``WorkerDied`` when a process died with
        it as its only call, as a suspect's child does; a record that only died beside others' calls
        may be innocent). A parked record is a dead letter already: it goes to the DLQ as it is. A
        record delivered again may have been in a call when a process died: the journal is
        read again then (a process of the queue may have died since this one last looked). It
        may also be one this process or a dead one accepted and counted, its acknowledgement
        lost (``_counted_already``): it is accepted again without a call and without a row,
        whatever its delivery count; one a dead process dead-lettered is rejected so.
        """
        limit = self.host.settings.delivery_limit
        counts = [m.delivery_count() or 1 for m in messages]
        journal = self.host.journal
        counted: set[int] = set()
        if max(counts) > 1:
            journal.collect()
            already = self._counted_already(messages, counts)
            counted = set(already)
            for i, result in already.items():
                poll.results[i] = result
        crashes = journal.crashes
        decided = [
            i for i, m in enumerate(messages) if (counts[i] > limit or is_parked(headers_of(m))) and i not in counted
        ]
        for i in decided:
            message = messages[i]
            failure = reserve_failure(partition_of(message), offset_of(message), headers_of(message), journal)
            poll.results[i] = (DEAD_LETTERED, failure, 0.0)
        if decided or counted:
            skipped = counted.union(decided)
            poll.finished(len(skipped))
            calls: Sequence[int] = [i for i in range(len(messages)) if i not in skipped]
        else:
            calls = range(len(messages))
        if not crashes:
            return calls, []
        suspects = [i for i in calls if (partition_of(messages[i]), offset_of(messages[i])) in crashes]
        if suspects:
            isolated = set(suspects)
            calls = [i for i in calls if i not in isolated]
        return calls, suspects

    def _counted_already(self, messages: list[Message], counts: list[int]) -> dict[int, Result]:
        """The redelivered records of a poll counted already, and how each ends now: accepted by
        this process, whose acknowledgement did not land (queueplane.run.share.executor.accepted),
        or accepted or dead-lettered by a process that died before its acknowledgements reached
        the broker (queueplane.run.share.executor.outbox).

        A dead process's file is taken over now, not at the next micro-batch: a redelivery can come first.
        """
        again = [i for i, count in enumerate(counts) if count > 1]
        places = [(partition_of(messages[i]), offset_of(messages[i])) for i in again]
        mine = self.host.accepted.find(places)
        if mine:
            log.info(
                "share fetcher %d: %d redelivered record(s) were accepted by this process before, their "
                "acknowledgement lost; accepting them again without a call",
                self.index,
                len(mine),
            )
        outbox = self.host.outbox
        outbox.adopt()
        others = [j for j in range(len(again)) if j not in mine]
        found = outbox.redelivered_counted([(*places[j], counts[again[j]]) for j in others])
        dead = {k for k in found if outbox.dead_lettered(*places[others[k]])}
        if found:
            log.info(
                "share fetcher %d: %d redelivered record(s) were counted by a worker process that died "
                "(%d of them dead-lettered); ending them as it did, without a call",
                self.index,
                len(found),
                len(dead),
            )
        already = dict.fromkeys((again[j] for j in mine), ALREADY_COUNTED_RESULT)
        for k in found:
            already[again[others[k]]] = ALREADY_DEAD_RESULT if k in dead else ALREADY_COUNTED_RESULT
        return already

    def _acknowledge(
        self, messages: list[Message], poll: Poll, polled_at: float, outcomes: list[OutcomeColumns], in_order: InOrder
    ) -> None:
        """Acknowledge the records of a poll not acknowledged while it ran and add their outcomes;
        latency runs from the poll.

        A poll whose every record was accepted without outputs is the common case: its rows,
        one per run of a partition's consecutive records (outcomes.py), are built straight from
        the messages, one pass over them a field, with no Python object per record.
        Otherwise every record's acknowledgement is decided first (dead letters written) and
        only then are they all given, so a failure while deciding leaves none of them given.
        """
        todo = in_order.left()
        acknowledge, results = self.consumer.acknowledge, poll.results
        latency_ms = (time.monotonic() - polled_at) * 1000
        if len(todo) < len(messages):
            messages = [messages[i] for i in todo]
            records, results, inflights = (
                [poll.records[i] for i in todo],
                [results[i] for i in todo],
                [poll.inflight[i] for i in todo],
            )
        else:
            records, inflights = poll.records, poll.inflight
        if not messages:
            return
        if results.count(ACCEPTED_RESULT) == len(messages):
            accept = AcknowledgeType.ACCEPT
            in_order.given = True
            for message in messages:
                acknowledge(message, accept)
            outcomes.append(accepted_columns(messages, latency_ms, inflights))
            return
        decided = [
            self._decide(record, result, inflight, polled_at, latency_ms)
            for record, result, inflight in zip(records, results, inflights, strict=True)
        ]
        in_order.given = True
        for message, (_, ack) in zip(messages, decided, strict=True):
            acknowledge(message, ack)
        rows = [outcome for outcome, _ in decided if outcome is not None]
        if rows:
            outcomes.append(columns_of(rows))

    def _release_unacknowledged(self, messages: list[Message], poll: Poll | None, in_order: InOrder) -> None:
        """A poll failed midway: release what it did not acknowledge, and commit.

        Left unacknowledged, they would wait for their acquisition lock to run out before
        another delivery. Released, they come back at once (the broker's limit keeps deliveries
        in reserve for the DLQ); a record whose dead letter was written before the failure may
        reach the DLQ twice, never lost.
        """
        if poll is not None:
            with poll.cond:
                poll.abandoned = True  # its calls still running report to nobody
        if not in_order.given:
            release = AcknowledgeType.RELEASE
            for i in in_order.left():
                try:
                    self.consumer.acknowledge(messages[i], release)
                except KafkaException as exc:
                    log.warning("share fetcher %d could not release a record of its failed poll: %s", self.index, exc)
        self.pending = not self._commit()

    def _acknowledge_accepted(self, messages: list[Message], poll: Poll, polled_at: float, in_order: InOrder) -> None:
        """While a poll runs, acknowledge and commit what it has accepted so far, in offset order.

        A poll is a whole producer batch, often thousands of records: held back until its last
        record ended, the acknowledgements of the first ones would be lost with a killed worker
        and their records handled again (one poll's worth of duplicates). The commit waits for
        the broker's answer: an asynchronous one was still unsent when a kill came 0.5 s later.
        Their outcomes are reported then, not with the rest of the poll: a handler that kills the
        process later in the poll must not take the rows of records already settled with it.
        They go to the outbox provisional before the commit and are settled by its answer
        (queueplane.run.share.executor.outbox): a process killed during the round trip leaves them to the
        next one, and rows of acknowledgements the broker did not record are dropped.
        """
        ready = in_order.accepted(poll.results)
        if not ready:
            return
        accept, acknowledge = AcknowledgeType.ACCEPT, self.consumer.acknowledge
        for i in ready:
            acknowledge(messages[i], accept)
        if in_order.counted:  # records counted already: acknowledged, no row
            ready = [i for i in ready if poll.results[i] is ACCEPTED_RESULT]
        if not ready:
            self.pending = not self._commit()
            return
        latency_ms = (time.monotonic() - polled_at) * 1000
        columns = accepted_columns([messages[i] for i in ready], latency_ms, [poll.inflight[i] for i in ready])
        token = self.host.outbox.add_provisional([columns])
        unrecorded: Unrecorded = None
        try:
            unrecorded = self._commit_unrecorded()
        finally:
            self.host.settle(token, unrecorded)  # dropped if the commit raised
        self.pending = unrecorded is None or bool(unrecorded)

    def _await(self, poll: Poll, chunks: list[Chunk], early_acks: Callable[[], None]) -> None:
        """Wait until every call ended; at the deadline give up on the unfinished (RELEASE or DLQ).

        Every STUCK_S it looks for chunks whose call runs that long and hands their calls not
        yet started to other threads, and every ACK_EVERY_S it calls ``early_acks``. Calls
        already producing outputs get DELIVERY_TIMEOUT_S more at the deadline: their outputs
        are on the way and must not be duplicated by a redelivery if they can still land.
        """
        pool, results = self.host.pool, poll.results
        next_acks = time.monotonic() + ACK_EVERY_S
        while True:
            with poll.cond:
                left = poll.deadline - time.monotonic()
                if poll.cond.wait_for(lambda: poll.unsettled <= 0, max(0.0, min(left, STUCK_S))):
                    return
            if left <= STUCK_S:
                break
            chunks += pool.split_stuck(chunks)
            if time.monotonic() >= next_acks:
                early_acks()
                next_acks = time.monotonic() + ACK_EVERY_S
        with poll.cond:
            poll.abandoned = True
            for chunk in chunks:
                if chunk.since:
                    pool.replace_stuck()  # its thread is inside a call past the deadline
                    self.host.journal.give_up(chunk.slot)
            timeout: Result = (RELEASED, Failure("Timeout", "the handler ran past its deadline"), 0.0)
            for i, result in enumerate(results):
                if result is None and i not in poll.producing:
                    results[i] = timeout
            if poll.cond.wait_for(lambda: not poll.producing, DELIVERY_TIMEOUT_S):
                return
            late: Result = (RELEASED, Failure("OutputTimeout", "outputs not delivered in time"), 0.0)
            for i in poll.producing:  # outputs still not delivered: another delivery may duplicate them, never lose
                if results[i] is None:
                    results[i] = late

    def _confirm_suspects(self, poll: Poll) -> None:
        """Calls whose outputs were reported refused with their batch (``SUSPECT``): those outputs
        written again alone. All taken, the call is accepted; one refused alone, the record is a
        dead letter (InvalidOutput, as one refused before it was sent); any other failure
        releases it for another delivery, as a failed output does."""
        results = poll.results
        with poll.cond:  # a call given up on at the deadline may still settle meanwhile
            suspected = list(poll.suspects.items())
        for index, suspects in suspected:
            result = results[index]
            if result is None or result[0] != SUSPECT:
                continue
            started = result[2]
            try:
                why = self.alone.first_refusal(suspects)
            except RuntimeError as exc:
                results[index] = (RELEASED, Failure.of(exc), started)
                continue
            results[index] = ACCEPTED_RESULT if why is None else (DEAD_LETTERED, Failure.of(why), started)

    def _write(self, record: ProducedRecord) -> None:
        """A dead letter or a parked copy, durable; raises when it was not written. Refused with
        its batch, it is written again alone, and only a refusal alone raises InvalidOutput."""
        try:
            self.host.produce_and_wait([record])
        except InvalidOutput:
            why = self.alone.refusal(record)
            if why is not None:
                raise why from None

    def _decide(
        self, record: Record, result: Result | None, inflight: int, polled_at: float, latency_ms: float
    ) -> tuple[Outcome | None, AcknowledgeType]:
        """The acknowledgement for an ended call and its row (None for a record counted already);
        the last allowed delivery never ends RELEASEd, because the broker would archive it: it
        goes to the DLQ instead."""
        if result is ALREADY_COUNTED_RESULT:
            return None, AcknowledgeType.ACCEPT
        if result is ALREADY_DEAD_RESULT:
            return None, AcknowledgeType.REJECT
        outcome, failure, ran_at = result or (RELEASED, Failure("Unknown", "no result"), 0.0)
        if outcome == RELEASED and record.delivery_count >= self.host.settings.delivery_limit:
            outcome = DEAD_LETTERED
        if outcome == ACCEPTED:
            return Outcome.of(record, ACCEPTED, None, latency_ms, inflight), AcknowledgeType.ACCEPT
        now = time.time()
        started = now - (time.monotonic() - (ran_at or polled_at))  # the handler's start, wall clock
        first = self.host.first_attempt(record, int(started * 1000))
        if outcome == DEAD_LETTERED:
            settings = self.host.settings
            if is_parked(record.headers):
                dead = unparked_dead_letter(record, settings.dlq_topic)
            else:
                failure = failure or Failure("Unknown", "")
                dead = dead_letter_record(
                    record, settings.dlq_topic, record.delivery_count, failure, first, int(now * 1000)
                )
            try:
                self._write(dead)
            except Exception as exc:
                return self._park(record, dead, failure, str(exc), polled_at, latency_ms, inflight)
            self.host.journal.cleared(record.partition, record.offset)  # no delivery of it comes again
            return Outcome.of(record, DEAD_LETTERED, failure, latency_ms, inflight), AcknowledgeType.REJECT
        return Outcome.of(record, RELEASED, failure, latency_ms, inflight), AcknowledgeType.RELEASE

    def _park(
        self,
        record: Record,
        dead: ProducedRecord,
        failure: Failure | None,
        why: str,
        polled_at: float,
        latency_ms: float,
        inflight: int,
    ) -> tuple[Outcome, AcknowledgeType]:
        """The DLQ refused ``dead``: keep it in the queue's topic (parked) and accept the delivery.

        Never ACCEPT or REJECT what is in neither the DLQ nor parked: when the queue's topic
        refuses the parked copy too, the record is released and the broker delivers it again,
        a reserve delivery (``SHARE_RESERVE_DELIVERIES``) that tries both writes once more. On
        the last delivery the broker allows, a RELEASE, like a lock that runs out, archives the
        record: there the record stays acquired while both writes are tried again with backoff,
        until its lock nearly runs out (the client has no lock renewal). Only a fault that
        outlasts all of that loses the record, which its row (``lost``) and an error line say.
        """
        where = f"{record.topic}-{record.partition}@{record.offset}"
        settings = self.host.settings
        last = record.delivery_count >= settings.broker_delivery_limit
        lock_s = settings.lock_ms / 1000
        hold_until = polled_at + lock_s - max(HOLD_MARGIN_S, lock_s * HOLD_MARGIN_SHARE) if last else 0.0
        pause = PARK_RETRY_S
        while True:
            try:
                self._write(parked_record(dead, record.topic))
                break
            except Exception as exc:
                park_error = str(exc)
            if time.monotonic() + pause >= hold_until:
                fate = LOST if last else RETRYING
                REFUSALS.error(
                    cause_of(settings.dlq_topic, why) + f" / {cause_of(record.topic, park_error)}",
                    f"DLQ write failed for {where} ({why}) and parking it failed ({park_error}): "
                    + ("the broker archives it: LOST" if last else "released for another delivery"),
                )
                return (
                    Outcome.of(record, RELEASED, refused_failure(fate, why), latency_ms, inflight),
                    AcknowledgeType.RELEASE,
                )
            time.sleep(pause)
            pause = min(pause * 2, PARK_RETRY_MAX_S)
            try:  # the DLQ may take it now
                self._write(dead)
            except Exception as exc:
                why = str(exc)
                continue
            self.host.journal.cleared(record.partition, record.offset)
            return Outcome.of(record, DEAD_LETTERED, failure, latency_ms, inflight), AcknowledgeType.REJECT
        REFUSALS.error(
            cause_of(settings.dlq_topic, why),
            f"DLQ write failed for {where} ({why}): parked in {record.topic} until the DLQ takes it",
        )
        self.parked = True
        return (
            Outcome.of(record, RELEASED, refused_failure(PARKED, why), latency_ms, inflight),
            AcknowledgeType.ACCEPT,
        )

    def _commit(self) -> bool:
        """Commit the acknowledgements given: whether the broker recorded them all."""
        unrecorded = self._commit_unrecorded()
        return unrecorded is not None and not unrecorded

    def _commit_unrecorded(self) -> Unrecorded:
        """Commit the acknowledgements given: the (topic, partition)s whose acknowledgements the
        broker did not record (none, the common case), or None when the commit failed."""
        try:
            with self.host.calls.bounded("commit_sync (acknowledgements)", COMMIT_TIMEOUT_S):
                results = self.consumer.commit_sync(COMMIT_TIMEOUT_S)
            failed = {tp: err for tp, err in (results or {}).items() if err is not None}
            if failed:
                log.warning("acknowledgements not recorded for %s", failed)
            return {(tp.topic, tp.partition) for tp in failed}
        except KafkaException as exc:
            # The broker redelivers what it did not record; outcomes stay as the handler decided.
            log.warning("acknowledgement commit failed: %s", exc)
            return None

    def _close_consumer(self) -> None:
        """Commit what is left and leave the group; a close that fails changes nothing the broker
        will not redo, and one that never returns ends the process (the call guard)."""
        with contextlib.suppress(Exception), self.host.calls.bounded("close (share consumer)", CLOSE_TIMEOUT_S):
            self.consumer.close()

    def _leave(self) -> None:
        """Drained: this consumer holds nothing unhandled (``_fetch_out``). Leave the group now,
        before another poll sends a fetch: records a consumer acquired and nobody polled come back
        one delivery higher when it closes or dies (the broker counts a released session as a
        delivery, KAFKA-19972). The process's next task starts a new fetcher in this one's place."""
        if self.pending:
            self.pending = not self._commit()
        self._close_consumer()
        self.left = True
        self._closed = True

    def drain(self) -> None:
        """Leave the group once nothing is left unhandled: at once if the last poll brought
        records, else after the next poll that does, or once the queue looks idle (_may_leave)."""
        self._drain_started = time.monotonic()
        self.draining = True

    def _may_leave(self) -> bool:
        host = self.host
        # Read only with a fetch out: a consumer whose last poll brought records leaves at once.
        moved_at = host.queue_end.moved_at() if self._fetch_out else 0.0
        return drain_may_end(self._fetch_out, self._drain_started, host.records_polled_at, moved_at, time.monotonic())

    def stop(self) -> None:
        """Ask the thread to end after its cycle (``close`` waits for it)."""
        self._closed = True

    def close(self) -> None:
        """End the thread, commit what is acknowledged, and leave the group (the process ends;
        a drain has left already)."""
        self._closed = True
        self._thread.join(self.host.settings.lock_ms / 1000 + DELIVERY_TIMEOUT_S)
        if self.pending:
            self.pending = not self._commit()
        self._close_consumer()


def drain_may_end(
    fetch_out: bool, drain_started: float, records_polled_at: float, queue_moved_at: float, now: float
) -> bool:
    """Whether a draining consumer leaves the group now: it holds nothing unhandled (no fetch
    out), or for DRAIN_POLL_S since the drain began no poll of its process brought records and
    the queue's topic did not grow (an idle queue gives its open fetch little to acquire), or it
    has drained for DRAIN_POLL_MAX_S."""
    if not fetch_out:
        return True
    quiet = now - max(drain_started, records_polled_at, queue_moved_at) >= DRAIN_POLL_S
    return quiet or now - drain_started >= DRAIN_POLL_MAX_S


# Share consumers leave the group cleanly when Spark stops the worker process.
