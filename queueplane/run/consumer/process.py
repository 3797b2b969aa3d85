"""What one Python worker process keeps for a consumer-group queue: settings, producer, group, transactions.

The group consumer only reads and commits offsets (Spark's Kafka source does the fetching);
with exactlyOnce, one transactional producer per input partition writes outputs, DLQ records
and offsets together (KIP-447), its id stable so a newer task fences an older one.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.offsets import fetch_committed
from queueplane.run.call_guard import CallGuard
from queueplane.run.crash_journal import CrashJournal, journal_folder
from queueplane.run.failed_writes import FailedWrites
from queueplane.run.handler import Handler, load_handler
from queueplane.run.memory_guard import guard
from queueplane.run.outcomes import (
    ProducedRecord,
    produce,
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
    settings: ConsumerSettings, topic: str, partition: int, calls: CallGuard | None = None
) -> Producer:
    """The partition's transactional producer, initialised.

    init_transactions fences any earlier producer with this id and aborts its open
    transaction, so what a dead task left half-written is never read by read_committed
    consumers, and the group's committed offset for the partition is settled.
    """
    producer = clients.producer(
        settings.kafka,
        {
            "transactional.id": settings.transactional_id(topic, partition),
            "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000),
            "linger.ms": 5,
        },
    )
    with calls.bounded("init_transactions", TXN_TIMEOUT_S) if calls else contextlib.nullcontext():
        producer.init_transactions(TXN_TIMEOUT_S)
    return producer


class TransactionalWriter:
    """A transactional producer for one input partition: outputs and offsets land together or not at all."""

    def __init__(self, process: WorkerProcess, topic: str, partition: int):
        self.process = process
        self.producer = transactional_producer(process.settings, topic, partition, process.calls)

    def commit(self, records: list[ProducedRecord], offset: TopicPartition) -> None:
        bounded = self.process.calls.bounded
        for attempt in range(1, 4):
            try:
                self.producer.begin_transaction()
                for item in records:
                    produce(self.producer, item, serve=True)
                group = self.process.group.consumer_group_metadata()
                with bounded("send_offsets_to_transaction", TXN_TIMEOUT_S):
                    self.producer.send_offsets_to_transaction([offset], group, TXN_TIMEOUT_S)
                with bounded("commit_transaction", TXN_TIMEOUT_S):
                    self.producer.commit_transaction(TXN_TIMEOUT_S)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.txn_requires_abort() and attempt < 3:
                    log.warning("transaction for %s aborted, trying again: %s", offset, error)
                    with bounded("abort_transaction", TXN_TIMEOUT_S):
                        self.producer.abort_transaction(TXN_TIMEOUT_S)
                    continue
                raise

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.producer.flush(5)
