"""What every queue runtime reports and writes: outcome rows, outputs, dead-letter records.

The share and consumer runtimes produce the same outcome rows (the streaming query's
output, read by the driver's sink) and the same output and DLQ records, so the columns,
the outcome names and the way a record is made durable live here once. How a handler's
output becomes a record to produce is in outputs.py, which a share suspect's child process
imports without this module's pyarrow.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Sequence
from itertools import accumulate, chain
from operator import itemgetter
from typing import Any, NamedTuple

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from queueplane.run.dead_letters import HEADER_PARKED, Failure, dlq_headers
from queueplane.run.handler import InvalidOutput, Record

# Columns of one outcome row: the streaming query's output. Tasks hand Spark Arrow batches of
# exactly this schema, so no per-row conversion runs in a Python worker beside the handlers.
OUTCOME_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.string()),
        ("delivery_count", pa.int32()),
        ("outcome", pa.string()),
        ("error", pa.string()),
        ("latency_ms", pa.float64()),
        ("inflight", pa.int32()),
    ]
)
_SQL_TYPES = {pa.string(): "string", pa.int32(): "int", pa.int64(): "long", pa.float64(): "double"}
OUTCOME_SCHEMA = ", ".join(f"{f.name} {_SQL_TYPES[f.type]}" for f in OUTCOME_ARROW)
ACCEPTED, RELEASED, DEAD_LETTERED = "accepted", "released", "dlq"
# Where the columns sit in OutcomeColumns (one list per OUTCOME_ARROW column).
TOPIC_COLUMN, PARTITION_COLUMN, OFFSET_COLUMN, DELIVERY_COLUMN, OUTCOME_COLUMN = (
    OUTCOME_ARROW.get_field_index(name) for name in ("topic", "partition", "offset", "delivery_count", "outcome")
)
# Consumer groups: a record at or below the group's committed offset, already handled before a restart.
SKIPPED = "skipped"
# kmq: deliveries the tracker timed out and produced again (a run summary's count, not a row's outcome).
REDELIVERED = "redelivered"
# kmq: a copy the tracker produced of a message that has ended since (dead-lettered for the
# processes it killed): it ends without a call, and the message is not counted again.
DUPLICATE = "duplicate"
FINAL_OUTCOMES = (ACCEPTED, DEAD_LETTERED)
DELIVERY_TIMEOUT_S = 30.0
DLQ_WRITE_FAILED = "DeadLetterWriteFailed"  # the error class of a delivery whose dead letter the DLQ refused

ProducedRecord = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]  # topic, key, value, headers


class Outcome(NamedTuple):
    """One outcome row, in OUTCOME_SCHEMA's column order: a tuple, because every record makes one
    and Spark takes tuples as rows as they are."""

    topic: str
    partition: int
    offset: int
    key: str | None
    delivery_count: int
    outcome: str
    error: str | None
    latency_ms: float
    inflight: int

    @classmethod
    def accepted(cls, record: Record, latency_ms: float, inflight: int) -> Outcome:
        """``of`` for the usual row: every accepted record makes one, on the slot's hot path, so
        it is built in one step, without ``of``'s calls for the error and the named tuple."""
        return _new_row(
            cls,
            (
                record.topic,
                record.partition,
                record.offset,
                decoded_key(record.key),
                record.delivery_count,
                ACCEPTED,
                None,
                latency_ms,
                inflight,
            ),
        )

    @classmethod
    def of(cls, record: Record, outcome: str, failure: Failure | None, latency_ms: float, inflight: int) -> Outcome:
        return cls(
            record.topic,
            record.partition,
            record.offset,
            key_text(record),
            record.delivery_count,
            outcome,
            error_text(failure),
            latency_ms,
            inflight,
        )


_new_row = tuple.__new__  # a row from its fields at once, past the named tuple's own __new__


# One list per OUTCOME_ARROW column, all as long. The share runtime hands a poll's outcomes over
# like this: a quick handler's poll of accepted records builds each column in one pass over its
# messages, where a row per record cost a tuple and nine reads (a third of its Python time).
OutcomeColumns = tuple[list[Any], ...]


def accepted_columns(messages: list[Message], latency_ms: float, inflight: list[int]) -> OutcomeColumns:
    """The outcome columns of messages all accepted at once, each column in one pass."""
    count = len(messages)
    return (
        list(map(Message.topic, messages)),
        list(map(Message.partition, messages)),
        list(map(Message.offset, messages)),
        list(map(decoded_key, map(Message.key, messages))),
        [delivery or 1 for delivery in map(Message.delivery_count, messages)],
        [ACCEPTED] * count,
        [None] * count,
        [latency_ms] * count,
        inflight,
    )


def columns_of(rows: list[Outcome]) -> OutcomeColumns:
    """Rows as columns, one at a time with ``itemgetter``: half the cost of ``zip(*rows)``,
    which builds every column's tuple at once (a task hands over 100k rows a batch)."""
    return tuple(list(map(itemgetter(i), rows)) for i in range(len(OUTCOME_ARROW)))


def outcome_batch(rows: list[Outcome]) -> pa.RecordBatch:
    """Outcome rows as one Arrow batch of OUTCOME_ARROW."""
    return columns_batch([columns_of(rows)])


def columns_batch(blocks: list[OutcomeColumns]) -> pa.RecordBatch:
    """Blocks of outcome columns, one after another, as one Arrow batch of OUTCOME_ARROW."""
    if len(blocks) == 1:
        columns = blocks[0]
    else:
        columns = tuple(list(chain.from_iterable(block[i] for block in blocks)) for i in range(len(OUTCOME_ARROW)))
    return pa.RecordBatch.from_arrays(
        [arrow_column(values, f.type) for values, f in zip(columns, OUTCOME_ARROW, strict=True)],
        schema=OUTCOME_ARROW,
    )


# array typecodes of the fixed-width columns; strings are offsets (int32) plus UTF-8 bytes.
_FIXED = {pa.int32(): "i", pa.int64(): "q", pa.float64(): "d"}


def arrow_column(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    """A column as an Arrow array, built from its buffers.

    Not ``pa.array``: its first call in a process imports pandas to check whether the values
    are pandas objects. That import took about 0.35 s of CPU in every Spark Python worker,
    while the workers of a micro-batch start side by side, longer than a trivial handler's
    records took.
    """
    count = len(values)
    if kind != pa.string():
        try:  # nothing missing, the common case: no scan for None first
            validity, data = None, array(_FIXED[kind], values)
        except TypeError:
            validity, data = validity_bitmap(values), array(_FIXED[kind], [v or 0 for v in values])
        return pa.Array.from_buffers(kind, count, [validity, pa.py_buffer(data)])
    if count and values[0] == values[-1] and values.count(values[0]) == count:
        return _repeated(values[0], count)  # the topic, most outcomes, no error
    validity = validity_bitmap(values)
    texts = values if validity is None else [v or "" for v in values]
    joined = "".join(texts)
    encoded = joined.encode()
    # One encode for the column; the lengths of the texts are their byte lengths when all is ASCII.
    lengths = map(len, texts) if len(encoded) == len(joined) else (len(t.encode()) for t in texts)
    offsets = array("i", [0])
    offsets.extend(accumulate(lengths))
    return pa.Array.from_buffers(kind, count, [validity, pa.py_buffer(offsets), pa.py_buffer(encoded)])


def _repeated(text: str | None, count: int) -> pa.Array:
    """A string column of one value in every row, with no work per row in Python: Arrow decodes
    it from a one-entry dictionary (a tenth of the time of building its offsets here)."""
    if text is None:
        nulls = pa.py_buffer(bytes((count + 7) // 8))
        return pa.Array.from_buffers(pa.string(), count, [nulls, _zeros(count + 1), pa.py_buffer(b"")])
    data = text.encode()
    entry = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(array("i", [0, len(data)])), pa.py_buffer(data)])
    indices = pa.Array.from_buffers(pa.int32(), count, [None, _zeros(count)])
    return pa.DictionaryArray.from_arrays(indices, entry).dictionary_decode()


def _zeros(count: int) -> pa.Buffer:
    """``count`` int32 zeros: the offsets of empty strings."""
    return pa.py_buffer(bytes(4 * count))


def validity_bitmap(values: Sequence[Any]) -> pa.Buffer | None:
    """Arrow's validity bitmap (bit i set: value i present), or None when nothing is missing."""
    if None not in values:
        return None
    bits = bytearray((len(values) + 7) // 8)
    for i, value in enumerate(values):
        if value is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return pa.py_buffer(bits)


def key_text(record: Record) -> str | None:
    return decoded_key(record.key)


def decoded_key(key: bytes | None) -> str | None:
    """A key as the outcome rows show it: text, with undecodable bytes replaced."""
    return key.decode("utf-8", "replace") if key is not None else None


def error_text(failure: Failure | None) -> str | None:
    return f"{failure.error_class}: {failure.message}" if failure else None


def dead_letter_record(
    record: Record, dlq_topic: str, delivery_count: int, failure: Failure, first_attempt_ms: int, last_attempt_ms: int
) -> ProducedRecord:
    """The DLQ record of a delivery: original key, value and headers plus the failure's headers."""
    headers = dlq_headers(
        record.headers,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        delivery_count=delivery_count,
        failure=failure,
        first_attempt_ms=first_attempt_ms,
        last_attempt_ms=last_attempt_ms,
    )
    return (dlq_topic, record.key, record.value, headers)


def parked_record(dead: ProducedRecord, queue_topic: str) -> ProducedRecord:
    """A dead letter the DLQ refused, as a record for the queue's own topic.

    Releasing it instead would hand it back to the broker, which archives a record past its
    delivery limit: gone from both places. Parked, it is delivered again like any record, and
    the worker that meets it tries the DLQ once more, without another handler call.
    """
    _, key, value, headers = dead
    return (queue_topic, key, value, [*headers, (HEADER_PARKED, b"1")])


def is_parked(headers: list[tuple[str, bytes | None]] | tuple[tuple[str, bytes | None], ...] | None) -> bool:
    return bool(headers) and any(k == HEADER_PARKED for k, _ in headers or ())


def unparked_dead_letter(record: Record, dlq_topic: str) -> ProducedRecord:
    """The DLQ record of a parked record: its headers are the dead letter's already."""
    headers = [(k, v or b"") for k, v in record.headers if k != HEADER_PARKED]
    return (dlq_topic, record.key, record.value, headers)


def produce(
    producer: Producer,
    record: ProducedRecord,
    on_delivery: Any = None,
    serve: bool = False,
    partition: int | None = None,
) -> None:
    """Hand one record to the producer, waiting while its local queue is full.

    ``serve``: this thread serves the producer's callbacks itself (no poll loop elsewhere).
    ``partition`` pins the record to a partition (kmq markers); else the key decides.
    """
    topic, key, value, headers = record
    if on_delivery is None and partition is None and not headers:
        try:  # the usual record, taken at once; on any error, the way below says what it was or waits
            producer.produce(topic, value, key)
            return
        except Exception:
            pass
    # Only the arguments a record has: the client parses each keyword given, and ``headers=[]``
    # with ``on_delivery=None`` doubled the cost of a produce call.
    extra: dict[str, Any] = {}
    if headers:
        extra["headers"] = headers
    if on_delivery is not None:
        extra["on_delivery"] = on_delivery
    if partition is not None:
        extra["partition"] = partition
    while True:
        try:
            producer.produce(topic, value, key, **extra)
            return
        except BufferError:
            if serve:
                producer.poll(0.01)
            else:
                time.sleep(0.005)  # the delivery thread drains it
        except KafkaException as exc:
            refused = refused_write(exc.args[0])
            if refused is None:
                raise
            raise refused from None
        except (TypeError, ValueError) as exc:  # what the client cannot even queue
            raise InvalidOutput(f"the record cannot be written: {exc}") from None


# Errors about the record itself: the same record is refused again however often it is sent.
_REFUSED = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD})


def refused_write(error: object) -> InvalidOutput | None:
    """A write error as InvalidOutput when the broker or client refuses the record itself, else None."""
    if isinstance(error, KafkaError) and error.code() in _REFUSED:
        return InvalidOutput(f"the record was refused: {error.str()} (over the topic's max.message.bytes?)")
    return None


def produce_and_wait(producer: Producer, records: list[ProducedRecord], partitions: list[int] | None = None) -> None:
    """Produce and block until every record is acknowledged by the brokers (durable), or raise.

    ``partitions`` pins each record to a partition (kmq markers); else the key decides.
    The producer's delivery callbacks must be served by another thread (its poll loop).
    """
    if not records:
        return
    pending = threading.Semaphore(0)
    errors: list[str] = []

    def delivered(err: Any, _msg: Message) -> None:
        if err is not None:
            errors.append(err)
        pending.release()

    for i, item in enumerate(records):
        produce(producer, item, delivered, partition=partitions[i] if partitions is not None else None)
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    for _ in records:
        if not pending.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"outputs not delivered within {DELIVERY_TIMEOUT_S:.0f}s")
    if errors:
        raise refused_write(errors[0]) or RuntimeError(f"output delivery failed: {errors[0]}")
