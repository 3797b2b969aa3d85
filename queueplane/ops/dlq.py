"""`queueplane dlq list` and `queueplane dlq redrive`: the dead-letter queue of any group type.

Every runtime writes the same DLQ records (queueplane.dlq), so one tool serves them all.
Which DLQ records are still pending is kept as the committed offsets of a consumer group of
its own (``<group id>.dlq-redrive``): redrive reads from there to the DLQ's end as it was
when the run started, and commits its position in the same Kafka transaction as the records
it writes, so a redrive stopped midway and run again neither duplicates nor loses one.
With ``--where``, records that do not match are copied to the DLQ's end in that transaction,
so they stay pending for a later redrive while the position moves on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from queueplane.errors import QueueplaneError, UsageError
from queueplane.kafka import clients
from queueplane.kafka import names as kn
from queueplane.kafka.consumed import headers_of, offset_of, partition_of, topic_of
from queueplane.kafka.offsets import fetch_committed
from queueplane.kafka.target import KafkaTarget
from queueplane.run import dead_letters as dlq
from queueplane.spec.model import QueueSpec, TopicSpec

TXN_TIMEOUT_S = 60.0
BATCH_S = 1.0  # a redrive transaction spans at most this long (and at most one second of --rate)
IDLE_END_S = 3.0  # nothing more arrives before the end offsets: transaction markers end the log
ANY_PARTITION = -1  # produce()'s default: the producer's partitioner chooses, by key


def redrive_group(queue: QueueSpec) -> str:
    return kn.redrive_group(queue.group.id)


@dataclass
class DeadLetter:
    partition: int
    offset: int
    key: str | None
    timestamp_ms: int
    source: str | None  # topic/partition/offset it came from
    delivery_count: int | None
    error_class: str | None
    error_message: str | None
    first_attempt_ms: int | None
    last_attempt_ms: int | None
    redrive_count: int
    value_bytes: int
    headers: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if value is not None else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def dead_letter(message: Message) -> DeadLetter:
    headers = {k: _text(v) or "" for k, v in headers_of(message)}
    source = None
    if dlq.HEADER_SOURCE_TOPIC in headers:
        source = "/".join(
            headers.get(h, "?")
            for h in (dlq.HEADER_SOURCE_TOPIC, dlq.HEADER_SOURCE_PARTITION, dlq.HEADER_SOURCE_OFFSET)
        )
    return DeadLetter(
        partition=partition_of(message),
        offset=offset_of(message),
        key=_text(message.key()),
        timestamp_ms=message.timestamp()[1],
        source=source,
        delivery_count=_int(headers.get(dlq.HEADER_DELIVERY_COUNT)),
        error_class=headers.get(dlq.HEADER_ERROR_CLASS),
        error_message=headers.get(dlq.HEADER_ERROR_MESSAGE),
        first_attempt_ms=_int(headers.get(dlq.HEADER_FIRST_ATTEMPT_MS)),
        last_attempt_ms=_int(headers.get(dlq.HEADER_LAST_ATTEMPT_MS)),
        redrive_count=_int(headers.get(dlq.HEADER_REDRIVE_COUNT)) or 0,
        value_bytes=len(message.value() or b""),
        headers=headers,
    )


def parse_where(items: list[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` filters: ``key`` is the record key; anything else a header, ``queueplane.`` optional."""
    filters = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--where {item!r}: expected KEY=VALUE, e.g. --where error.class=Timeout")
        filters.append((name.strip(), value))
    return filters


def matches(message: Message, filters: list[tuple[str, str]]) -> bool:
    headers = {k: _text(v) for k, v in headers_of(message)}
    for name, value in filters:
        actual = _text(message.key()) if name == "key" else headers.get(name, headers.get(f"queueplane.{name}"))
        if actual != value:
            return False
    return True


class _DlqReader:
    """The DLQ's partitions, assigned at the redrive group's position (or the log start)."""

    def __init__(
        self, target: KafkaTarget, queue: QueueSpec, from_start: bool = False, consumer: Consumer | None = None
    ):
        """``consumer``: one of ``redrive_reader``'s, kept by the caller (``close`` leaves it
        open, with nothing assigned); otherwise the reader makes its own and closes it."""
        self.topic = queue.dead_letter.name
        self.kept = consumer is not None
        self.consumer = consumer if consumer is not None else redrive_reader(target, queue)
        partitions = range(queue.dead_letter.partitions)
        committed = {} if from_start else fetch_committed(self.consumer, self.topic, partitions)
        self.start = {p: _or_beginning(committed.get(p)) for p in partitions}
        marks = {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=15) for p in partitions}
        self.ends = {p: marks[p][1] for p in partitions}
        self.position = {p: o if o >= 0 else marks[p][0] for p, o in self.start.items()}
        live = [TopicPartition(self.topic, p, self.start[p]) for p in partitions if self.position[p] < self.ends[p]]
        self.open = {tp.partition for tp in live}
        if live:
            self.consumer.assign(live)

    def read(self) -> Message | None:
        """The next DLQ record before the end offsets of the start, or None when there is none left."""
        idle_since = time.monotonic()
        while self.open:
            message = self.consumer.poll(0.2)
            if message is None:
                if time.monotonic() - idle_since > IDLE_END_S:
                    self.open.clear()  # only transaction markers between the position and the end
                continue
            if message.error():
                continue
            p = partition_of(message)
            if p not in self.open:
                continue
            offset = offset_of(message)
            if offset >= self.ends[p]:
                self.open.discard(p)
                continue
            self.position[p] = offset + 1
            if self.position[p] >= self.ends[p]:
                self.open.discard(p)
            return message
        return None

    def pending(self) -> int:
        return sum(max(0, self.ends[p] - self.position[p]) for p in self.ends)

    def close(self) -> None:
        if self.kept:
            self.consumer.unassign()
        else:
            self.consumer.close()


def redrive_reader(target: KafkaTarget, queue: QueueSpec) -> Consumer:
    """A consumer of the redrive group that reads the DLQ without committing."""
    return clients.consumer(
        target.settings,
        {"group.id": redrive_group(queue), "enable.auto.commit": False, "isolation.level": "read_committed"},
    )


def _or_beginning(committed: int | None) -> int:
    """Where the redrive group reads a partition from: its commit, else the log's start."""
    return OFFSET_BEGINNING if committed is None else committed


def pending_by_offsets(target: KafkaTarget, queue: QueueSpec) -> int:
    """DLQ records after the redrive position, counted by offsets: quick enough for a status line.

    Transaction markers (of redrives, of exactly-once workers) sit between records and count
    too, so this can exceed what `dlq list` counts by reading.
    """
    reader = _DlqReader(target, queue)
    try:
        return reader.pending()
    finally:
        reader.close()


class DeadLetterCounter:
    """Records waiting in the DLQ, asked every few seconds (a worker's gauge and Queue status).

    Counted by reading, as `dlq list` counts, while at most ``exact_up_to`` offsets lie between
    the redrive position and the end: an exactly-once worker's transaction markers sit between
    its dead letters, and offsets alone would count each of them. Beyond that the offsets are
    the answer (an upper bound). The DLQ is read again only when its position or ends moved.
    """

    def __init__(self, target: KafkaTarget, queue: QueueSpec, exact_up_to: int = 10_000):
        self.target, self.queue, self.exact_up_to = target, queue, exact_up_to
        self._seen: tuple[object, int] | None = None
        # Kept from count to count (a consumer made every few seconds per queue cost more than
        # the count); a count that fails lets it go, and the next makes a new one.
        self._consumer: Consumer | None = None

    def __call__(self) -> int:
        if self._consumer is None:
            self._consumer = redrive_reader(self.target, self.queue)
        try:
            return self._count(_DlqReader(self.target, self.queue, consumer=self._consumer))
        except Exception:
            self.close()
            raise

    def _count(self, reader: _DlqReader) -> int:
        try:
            where = (sorted(reader.position.items()), sorted(reader.ends.items()))
            if self._seen is not None and self._seen[0] == where:
                return self._seen[1]
            count = reader.pending()
            if count <= self.exact_up_to:
                count = 0
                while reader.read() is not None:
                    count += 1
            self._seen = (where, count)
            return count
        finally:
            reader.close()

    def close(self) -> None:
        """Let go of the consumer."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def list_dead_letters(
    target: KafkaTarget, queue: QueueSpec, limit: int = 100, include_redriven: bool = False
) -> tuple[list[DeadLetter], int]:
    """DLQ records still pending (from the redrive position; all with ``include_redriven``) and how many there are."""
    reader = _DlqReader(target, queue, from_start=include_redriven)
    try:
        rows: list[DeadLetter] = []
        pending = 0  # counted by reading: offsets alone would count transaction markers too
        while (message := reader.read()) is not None:
            pending += 1
            if len(rows) < limit:
                rows.append(dead_letter(message))
        return rows, pending
    finally:
        reader.close()


@dataclass
class RedriveReport:
    dlq_topic: str
    moved: int = 0
    kept: int = 0  # did not match --where: copied to the DLQ's end, still pending
    # moved records whose source header named another topic (still sent to the queue's own)
    other_source: int = 0
    transactions: int = 0
    positions: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _redriven(message: Message, source: TopicSpec) -> tuple[bool, int | None, list[tuple[str, str | bytes | None]]]:
    """How a DLQ record goes back to the queue's topic: whether its source header names another
    topic, the partition it came from (kept when it is the queue's), and its headers with the
    failure's removed and the redrive's added.

    Headers are data anyone who can write to the DLQ controls, so they never choose the topic:
    a redrive writes only to the spec's own topic, with the platform's credentials.
    """
    headers = headers_of(message)
    values = {k: _text(v) for k, v in headers}
    named = values.get(dlq.HEADER_SOURCE_TOPIC)
    elsewhere = named is not None and named != source.name
    partition = None if elsewhere else _int(values.get(dlq.HEADER_SOURCE_PARTITION))
    if partition is not None and not (0 <= partition < source.partitions):
        partition = None
    count = (_int(values.get(dlq.HEADER_REDRIVE_COUNT)) or 0) + 1
    kept = [(k, v or b"") for k, v in headers if k not in dlq.DLQ_HEADERS and k not in dlq.REDRIVE_HEADERS]
    origin = f"{topic_of(message)}/{partition_of(message)}/{offset_of(message)}".encode()
    added = [(dlq.HEADER_REDRIVE_FROM, origin), (dlq.HEADER_REDRIVE_COUNT, str(count).encode())]
    return elsewhere, partition, [*kept, *added]


def redrive(
    target: KafkaTarget,
    queue: QueueSpec,
    rate: float | None = None,
    where: list[tuple[str, str]] | None = None,
    on_progress: Callable[[RedriveReport, int], None] = lambda _r, _total: None,
) -> RedriveReport:
    """Move pending DLQ records back to their source topic, at most ``rate`` a second."""
    reader = _DlqReader(target, queue)
    report = RedriveReport(queue.dead_letter.name)
    total = reader.pending()
    producer = clients.producer(
        target.settings,
        {"transactional.id": f"queueplane.{redrive_group(queue)}", "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000)},
    )
    producer.init_transactions(TXN_TIMEOUT_S)
    per_batch = max(1, int(rate)) if rate else 500
    started, sent = time.monotonic(), 0
    try:
        while True:
            batch: list[Message] = []
            batch_started = time.monotonic()
            while len(batch) < per_batch and time.monotonic() - batch_started < BATCH_S:
                message = reader.read()
                if message is None:
                    break
                batch.append(message)
            if not batch:
                break
            producer.begin_transaction()
            for message in batch:
                if rate:  # steady pace: the n-th record no earlier than n / rate seconds after the start
                    time.sleep(max(0.0, started + sent / rate - time.monotonic()))
                if where and not matches(message, where):
                    producer.produce(report.dlq_topic, message.value(), message.key(), headers=message.headers() or [])
                    report.kept += 1
                else:
                    elsewhere, partition, headers = _redriven(message, queue.topic)
                    producer.produce(
                        queue.topic.name,
                        message.value(),
                        message.key(),
                        ANY_PARTITION if partition is None else partition,
                        headers=headers,
                    )
                    report.moved += 1
                    report.other_source += elsewhere
                sent += 1
                producer.poll(0)
            offsets = [TopicPartition(reader.topic, p, o) for p, o in reader.position.items() if o >= 0]
            producer.send_offsets_to_transaction(offsets, reader.consumer.consumer_group_metadata(), TXN_TIMEOUT_S)
            producer.commit_transaction(TXN_TIMEOUT_S)
            report.transactions += 1
            report.positions = {tp.partition: tp.offset for tp in offsets}
            on_progress(report, total)
    except KafkaException as exc:
        raise RedriveFailed(
            f"redrive of {report.dlq_topic} stopped: {exc.args[0].str()}; run it again to go on"
        ) from None
    finally:
        reader.close()
    return report


class RedriveFailed(QueueplaneError):
    """The cluster refused a redrive transaction; what was committed stays, the rest is still pending."""
