"""What one Python worker process keeps for a consumer-group queue: settings, producer, group, transactions.

The group's consumer is the process's member of the group (member.py): it reads the records
and commits their offsets, on its own thread only. With exactlyOnce, one transactional producer
per input partition writes outputs, DLQ records and offsets together (KIP-447), with the
member's group metadata, so a member the group has moved on from is fenced by its generation,
and the id stays stable so a newer producer of the partition fences an older one.

A record the broker refuses inside a transaction (too large for its topic: the same record is
refused on every try) makes librdkafka report it in its delivery callback and the transaction
abortable: committing it can never succeed. The writer aborts it, lets its task put something
else in the refused record's place (``TransactionalWriter.commit``), and writes the transaction
again, so the outputs, the replacement and the offsets still land together or not at all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from queueplane.handler_api import Handler, InvalidOutput
from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.offsets import fetch_committed
from queueplane.run.executor.call_guard import CallGuard
from queueplane.run.executor.crash_journal import CrashJournal, journal_folder
from queueplane.run.executor.failed_writes import FailedWrites, fingerprint
from queueplane.run.executor.handler import load_handler
from queueplane.run.executor.memory_guard import guard
from queueplane.run.executor.processes import ServedProducer
from queueplane.run.outcomes import (
    ProducedRecord,
    produce,
    refused_write,
)
from queueplane.run.settings import QueueSettings

log = logging.getLogger("queueplane.worker")

TXN_TIMEOUT_S = 60.0
# A synchronous group commit takes no timeout: librdkafka gives its request socket.timeout.ms (60 s).
GROUP_COMMIT_TIMEOUT_S = 60.0
# How long at-least-once outputs wait to fill a batch. Every task's process has its own producer
# at a fraction of the queue's rate: at 2 ms its batches were small enough that the broker and
# every reader of the outputs paid twice as much a record (docs/design/consumer-throughput.md).
# A record counts when its handler returns; only the commit after it waits for the linger.
OUTPUT_LINGER_MS = 20


@dataclass(frozen=True, kw_only=True)
class MemberSettings(QueueSettings):
    """What a group member (member.py) needs, whichever group type hosts it (consumer, kmq)."""

    # The queue's topic, where a partition with no commit starts, the group protocol the broker
    # has ("consumer", KIP-848, else "classic"), and the slices.
    topic: str = ""
    start_from: str = "earliest"
    group_protocol: str = "classic"
    batch_ms: int = 1000
    idle_batch_ms: int = 15_000
    # The most records a member holds fed and uncommitted (``--max-batch-records`` over the
    # members): what a kill can make come again. 0: no bound but maxInFlight's.
    max_uncommitted: int = 0
    # The partitions a member holds once every member of a slice has joined (the topic's over
    # the slice's tasks). 0: not known, no member counts as holding more.
    fair_share: int = 0
    exactly_once: bool = False


@dataclass(frozen=True, kw_only=True)
class ConsumerSettings(MemberSettings):
    """Everything a task needs, sent from the driver as JSON (no spec parsing on executors)."""

    ordering: str
    slots: int
    slot_queue: int
    backoff_ms: int
    max_backoff_ms: int
    exactly_once: bool
    commit_interval_ms: int = 1000

    def transactional_id(self, topic: str, partition: int) -> str:
        """Stable per input partition: a new task's producer fences the one a dead task left behind."""
        return f"{kn.transactional_id_prefix(self.group_id)}{topic}.{partition}"


class WorkerProcess:
    """One per Python worker process and queue: the handler, the plain producer, the group's committer."""

    def __init__(self, settings: ConsumerSettings, group: Any = None):
        self.settings = settings
        self.handler: Handler = load_handler(settings.handler, settings.search_paths)
        self.journal = CrashJournal(journal_folder(settings.group_id), settings.lock_ms / 1000)
        self.memory_guard = guard(settings.memory_limit_mi, self.journal.ending)
        self.calls = CallGuard(self.journal.disown)
        # Callbacks for failed writes only, one for the producer: a task learns its outputs are
        # durable from the producer's count of unacknowledged records, and which failed from
        # ``failed_writes`` (PartitionTask.commit).
        self.failed_writes = FailedWrites()
        self.delivery = ServedProducer(
            settings.kafka,
            linger_ms=OUTPUT_LINGER_MS,
            batch_bytes=settings.batch_bytes,
            errors_only=True,
            on_failed=self.failed_writes,
        )
        self.producer = self.delivery.producer
        # The member's consumer (member.py), called on its own thread only; without a member (a
        # process driven by hand), a consumer that never subscribes. read_committed makes
        # committed() wait for offsets of open transactions.
        self.group = group or clients.consumer(
            settings.kafka,
            {"group.id": settings.group_id, "enable.auto.commit": False, "isolation.level": "read_committed"},
        )
        # The group's metadata as the member's thread last noted it (at each assignment and every
        # second): asked for during a revocation from any other thread, it does not come until
        # the group gives up on the member (max.poll.interval.ms).
        self.group_metadata: Any = None

    def transaction_group(self) -> Any:
        """The group metadata a transaction sends with its offsets (KIP-447)."""
        if self.group_metadata is None:
            self.group_metadata = self.group.consumer_group_metadata()
        return self.group_metadata

    def committed(self, topic: str, partition: int) -> int | None:
        return fetch_committed(self.group, topic, [partition])[partition]

    def commit(self, topic: str, partition: int, offset: int) -> None:
        with self.calls.bounded("commit (group offsets)", GROUP_COMMIT_TIMEOUT_S):
            self.group.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)

    def close(self) -> None:
        self.delivery.close()
        self.journal.close()
        with contextlib.suppress(Exception):
            self.group.close()


def transactional_producer(
    settings: ConsumerSettings,
    topic: str,
    partition: int,
    calls: CallGuard | None = None,
    on_failed: Callable[[Any, Any], None] | None = None,
) -> Producer:
    """The partition's transactional producer, initialised.

    init_transactions fences any earlier producer with this id and aborts its open
    transaction, so what a dead task left half-written is never read by read_committed
    consumers, and the group's committed offset for the partition is settled.
    ``on_failed``: the delivery callback, for failed writes only.
    """
    role: dict[str, Any] = {
        "transactional.id": settings.transactional_id(topic, partition),
        "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000),
        "linger.ms": 5,
    }
    if on_failed is not None:
        role["on_delivery"] = on_failed
        role["delivery.report.only.error"] = True
    producer = clients.producer(settings.kafka, role)
    with calls.bounded("init_transactions", TXN_TIMEOUT_S) if calls else contextlib.nullcontext():
        producer.init_transactions(TXN_TIMEOUT_S)
    return producer


class Writes(Protocol):
    """One input record's share of a transaction: what it writes, and the partition those writes
    are pinned to (None: their keys decide). Its task replaces both when the broker refuses one."""

    produced: list[ProducedRecord]
    partition: int | None


# How often a transaction is tried when it fails for another reason than a refused record.
TXN_ATTEMPTS = 3


W = TypeVar("W", bound=Writes)


class _Refused(Exception):
    """The attempt cannot commit: a record of it was refused, or the transaction went abortable
    (a refused batch's answer came while its records were still being handed over)."""


class TransactionalWriter:
    """A transactional producer for one input partition: outputs and offsets land together or not at all.

    The broker refuses a whole record batch when the batch is over the topic's
    max.message.bytes, and librdkafka reports every record of it refused: a small record
    batched with a big one looks refused too. So a record reported refused is only a suspect
    until it was refused in a batch of its own: from the next attempt on, the writer sends it
    alone (a flush before it and after it), and only a record refused alone, or refused by the
    client before it was sent, is handed to its task to be replaced.
    """

    def __init__(self, process: WorkerProcess, topic: str, partition: int):
        self.process = process
        # Records refused in the attempt being written (fingerprint, why), reported by the
        # delivery callback, which runs on the thread that calls the producer (this writer's).
        self._refusals: list[tuple[int, InvalidOutput]] = []
        self.producer = transactional_producer(process.settings, topic, partition, process.calls, self._failed)

    def _failed(self, err: Any, msg: Any) -> None:
        why = refused_write(err)
        if why is not None:
            self._refusals.append((fingerprint(msg.topic(), msg.key(), msg.value()), why))

    def commit(self, writes: Sequence[W], offset: TopicPartition, refused: Callable[[W, InvalidOutput], None]) -> None:
        """Write ``writes`` and commit ``offset`` in one transaction.

        When a record of it is refused, the transaction is aborted and written again from the
        start: an aborted transaction is never read (read_committed), so nothing of the refused
        attempt lands, and every record of the others is written again. A record refused alone
        (or before it was sent) is certain: the ``Writes`` holding it goes to ``refused``, which
        replaces its records, or raises to fail the task. Every attempt that fails on refusals
        either replaces a record or sends one more suspect alone, and a record is replaced at
        most twice (its outputs, then its dead letter; its parked copy fails the task), so the
        attempts end.
        """
        bounded = self.process.calls.bounded
        alone: set[int] = set()  # suspects: records refused in a batch, sent alone from now on
        failures = 0
        while True:
            self._refusals, certain = [], []
            try:
                self.producer.begin_transaction()
                for entry in writes:
                    for item in entry.produced:
                        topic, key, value, _ = item
                        suspect = bool(alone) and fingerprint(topic, key, value) in alone
                        if suspect:
                            self._flush()  # the records before it go in batches of their own
                        try:
                            produce(self.producer, item, serve=True, partition=entry.partition)
                        except InvalidOutput as why:  # refused before it was sent: certain
                            certain.append((fingerprint(topic, key, value), why))
                            raise _Refused(f"a record of the transaction was refused: {why}") from None
                        except KafkaException as exc:
                            if exc.args[0].code() != KafkaError._STATE:
                                raise
                            raise _Refused(f"the transaction cannot be written on: {exc.args[0]}") from None
                        if suspect:
                            self._flush()
                group = self.process.transaction_group()
                with bounded("send_offsets_to_transaction", TXN_TIMEOUT_S):
                    self.producer.send_offsets_to_transaction([offset], group, TXN_TIMEOUT_S)
                with bounded("commit_transaction", TXN_TIMEOUT_S):
                    self.producer.commit_transaction(TXN_TIMEOUT_S)
                return
            except (KafkaException, _Refused) as exc:
                error: KafkaError | None = exc.args[0] if isinstance(exc, KafkaException) else None
                if error is not None and not error.txn_requires_abort():
                    raise
                with bounded("abort_transaction", TXN_TIMEOUT_S):
                    self.producer.abort_transaction(TXN_TIMEOUT_S)
                self.producer.poll(0)  # the aborted attempt's last reports
                # A suspect's batch held it alone, so its refusal is certain; any other refused
                # record shared its batch, and is sent alone next time.
                certain += [(print_, why) for print_, why in self._refusals if print_ in alone]
                suspects = {print_ for print_, _ in self._refusals} - alone
                alone |= suspects
                if certain:
                    self._turn(writes, dict(certain), refused)
                    continue
                if suspects:
                    continue
                failures += 1
                if failures >= TXN_ATTEMPTS:
                    raise
                log.warning("transaction for %s aborted, trying again: %s", offset, error or exc)

    def _flush(self) -> None:
        """Wait until what was sent is acknowledged or refused; a refusal ends the attempt."""
        with self.process.calls.bounded("flush (transaction)", TXN_TIMEOUT_S):
            self.producer.flush(TXN_TIMEOUT_S)
        if self._refusals:
            raise _Refused("a record of the transaction was refused")

    @staticmethod
    def _turn(writes: Sequence[W], whys: dict[int, InvalidOutput], refused: Callable[[W, InvalidOutput], None]) -> None:
        """Hand every entry holding a record refused for certain to ``refused``."""
        for entry in writes:
            for topic, key, value, _ in entry.produced:
                why = whys.get(fingerprint(topic, key, value))
                if why is not None:
                    refused(entry, why)
                    break

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.producer.flush(5)
