"""What one Python worker process keeps for a consumer-group queue: settings, producer, group, transactions.

The group consumer only reads and commits offsets (Spark's Kafka source does the fetching);
with exactlyOnce, one transactional producer per input partition writes outputs, DLQ records
and offsets together (KIP-447), its id stable so a newer task fences an older one.

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
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.offsets import fetch_committed
from queueplane.run.call_guard import CallGuard
from queueplane.run.crash_journal import CrashJournal, journal_folder
from queueplane.run.failed_writes import FailedWrites, fingerprint
from queueplane.run.handler import Handler, InvalidOutput, load_handler
from queueplane.run.memory_guard import guard
from queueplane.run.outcomes import (
    ProducedRecord,
    produce,
    refused_write,
)
from queueplane.run.processes import ServedProducer
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
class ConsumerSettings(QueueSettings):
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

    def __init__(self, settings: ConsumerSettings):
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
        # Never subscribes: it reads and commits the group's offsets, and lends its group metadata
        # to transactions. read_committed makes committed() wait for offsets of open transactions.
        self.group = clients.consumer(
            settings.kafka,
            {"group.id": settings.group_id, "enable.auto.commit": False, "isolation.level": "read_committed"},
        )

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


class _RefusedBeforeSent(Exception):
    """The client refused a record before sending it (over its own message.max.bytes)."""


class TransactionalWriter:
    """A transactional producer for one input partition: outputs and offsets land together or not at all."""

    def __init__(self, process: WorkerProcess, topic: str, partition: int):
        self.process = process
        # Records refused in the transaction being written (fingerprints, why), reported by the
        # delivery callback, which runs on the thread that calls the producer (this writer's).
        self._refusals: list[tuple[int, InvalidOutput]] = []
        self.producer = transactional_producer(process.settings, topic, partition, process.calls, self._failed)

    def _failed(self, err: Any, msg: Any) -> None:
        why = refused_write(err)
        if why is not None:
            self._refusals.append((fingerprint(msg.topic(), msg.key(), msg.value()), why))

    def commit(
        self, writes: Sequence[Writes], offset: TopicPartition, refused: Callable[[Writes, InvalidOutput], None]
    ) -> None:
        """Write ``writes`` and commit ``offset`` in one transaction.

        When the broker or the client refuses a record of it, the transaction is aborted, each
        ``Writes`` holding a refused record is handed to ``refused`` (which replaces its records,
        or raises to fail the task), and the transaction is written again from the start: an
        aborted transaction is never read (read_committed), so nothing of the refused attempt
        lands, and every record of the others is written again. Each refusal moves a record one
        step (its output, then its dead letter, then its parked copy, which fails the task), so
        the attempts end.
        """
        bounded = self.process.calls.bounded
        failures = 0
        while True:
            self._refusals = []
            try:
                self.producer.begin_transaction()
                for entry in writes:
                    for item in entry.produced:
                        try:
                            produce(self.producer, item, serve=True, partition=entry.partition)
                        except InvalidOutput as why:  # nothing of it was sent, but the entry's other records were
                            topic, key, value, _ = item
                            self._refusals.append((fingerprint(topic, key, value), why))
                            raise _RefusedBeforeSent from None
                group = self.process.group.consumer_group_metadata()
                with bounded("send_offsets_to_transaction", TXN_TIMEOUT_S):
                    self.producer.send_offsets_to_transaction([offset], group, TXN_TIMEOUT_S)
                with bounded("commit_transaction", TXN_TIMEOUT_S):
                    self.producer.commit_transaction(TXN_TIMEOUT_S)
                return
            except (KafkaException, _RefusedBeforeSent) as exc:
                error: KafkaError | None = exc.args[0] if isinstance(exc, KafkaException) else None
                if error is not None and not error.txn_requires_abort():
                    raise
                with bounded("abort_transaction", TXN_TIMEOUT_S):
                    self.producer.abort_transaction(TXN_TIMEOUT_S)
                self.producer.poll(0)  # the aborted attempt's last reports
                if self._turn_refused(writes, refused):
                    continue
                failures += 1
                if error is None or failures >= TXN_ATTEMPTS:
                    raise
                log.warning("transaction for %s aborted, trying again: %s", offset, error)

    def _turn_refused(self, writes: Sequence[Writes], refused: Callable[[Writes, InvalidOutput], None]) -> bool:
        """Hand every entry with a refused record to ``refused``; whether there was any."""
        if not self._refusals:
            return False
        whys = dict(self._refusals)
        turned = False
        for entry in writes:
            for topic, key, value, _ in entry.produced:
                why = whys.get(fingerprint(topic, key, value))
                if why is not None:
                    refused(entry, why)
                    turned = True
                    break
        return turned

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.producer.flush(5)
