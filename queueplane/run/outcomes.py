"""What every queue runtime reports and writes: outcome rows, outputs, dead-letter records.

The share, consumer and kmq runtimes produce the same outcome rows (the streaming query's
output, read by the driver's sink) and the same output and DLQ records, so the columns,
the outcome names and the way a record is made durable live here once. How a handler's
output becomes a record to produce is in outputs.py, which a share suspect's child process
imports without this module's pyarrow.

Inside a worker, each record's outcome is an ``Outcome``. What a task hands Spark is rows of
``OUTCOME_ARROW``, of two kinds in one schema:

- a *run*: accepted records of one partition at consecutive offsets, all at one delivery count,
  among the outcomes a task hands over at once. One row stands for them all: ``offset`` and
  ``last_offset`` are its first and last record (so ``records`` is ``last_offset - offset + 1``,
  and the span holds no record of another outcome), ``latency_ms`` their handler times summed,
  ``latency_buckets`` how many of them fell in each bucket of ``LATENCY_BUCKETS`` (the last one
  counting those above every bound, +Inf), ``inflight`` the most calls in flight as any of them
  started, and no key or error;
- every other record (released, dead-lettered, skipped, ...): a row of its own, with its key,
  error and latency as the record had them, ``records`` 1, ``last_offset`` its offset and no
  buckets.

A quick handler's records are nearly all accepted, so a task's thousands of records a second
become a few rows per partition: the Arrow batches, Spark's conversion of them, and the driver's
counts no longer grow with the records. The counts stay exact: the driver weighs each row by
``records``, adds the runs' buckets to the latency histogram (the one-record rows' latencies go
in the same buckets as before), and a run's delivery count is every one of its records'.

The buckets are one list column, not a column per bucket: the bounds are named once
(``LATENCY_BUCKETS``, which the metrics' histogram uses too), so changing them changes neither
the schema's text nor any reader, and a row without buckets is one null.
"""

from __future__ import annotations

import threading
import time
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain, compress, groupby, repeat
from operator import attrgetter, itemgetter, not_, truediv
from typing import Any, NamedTuple

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from queueplane.handler_api import InvalidOutput, Record
from queueplane.run.dead_letters import HEADER_PARKED, Failure, dlq_headers

# Handler latency buckets, upper bounds in seconds: the metrics' histogram and the runs' counts.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LATENCY_SLOTS = len(LATENCY_BUCKETS) + 1  # a run's counts: one per bound, then +Inf

# Columns of the outcome rows: the streaming query's output. Tasks hand Spark Arrow batches of
# exactly this schema, so no per-row conversion runs in a Python worker beside the handlers.
OUTCOME_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),  # the row's first record
        ("last_offset", pa.int64()),  # its last record
        ("records", pa.int32()),  # records the row stands for
        ("key", pa.string()),  # one-record rows only
        ("delivery_count", pa.int32()),  # of each of its records
        ("outcome", pa.string()),
        ("error", pa.string()),
        ("latency_ms", pa.float64()),  # its records' handler times, summed
        ("latency_buckets", pa.list_(pa.int32())),  # runs only: records per LATENCY_BUCKETS bucket
        ("inflight", pa.int32()),  # the most calls in flight as one of its records' calls started
    ]
)
_SQL_TYPES = {
    pa.string(): "string",
    pa.int32(): "int",
    pa.int64(): "long",
    pa.float64(): "double",
    pa.list_(pa.int32()): "array<int>",
}
OUTCOME_SCHEMA = ", ".join(f"{f.name} {_SQL_TYPES[f.type]}" for f in OUTCOME_ARROW)
ACCEPTED, RELEASED, DEAD_LETTERED = "accepted", "released", "dlq"
# Where the columns sit in OutcomeColumns (one list per OUTCOME_ARROW column).
(
    TOPIC_COLUMN,
    PARTITION_COLUMN,
    OFFSET_COLUMN,
    LAST_OFFSET_COLUMN,
    RECORDS_COLUMN,
    DELIVERY_COLUMN,
    OUTCOME_COLUMN,
) = (
    OUTCOME_ARROW.get_field_index(name)
    for name in ("topic", "partition", "offset", "last_offset", "records", "delivery_count", "outcome")
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
# Quick-path records settled together (their task's lock and rows once a run, not once a
# record): a run ends at this many records, or once its first record was accepted this long
# ago, so a slow handler's records are not held back from the next commit or end marker.
SETTLE_EVERY = 256
SETTLE_WITHIN_S = 0.05
DLQ_WRITE_FAILED = "DeadLetterWriteFailed"  # the error class of a delivery whose dead letter the DLQ refused

ProducedRecord = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]  # topic, key, value, headers


class Outcome(NamedTuple):
    """One record's outcome inside a worker: a tuple, built once per record on the hot paths.
    Handed over, the accepted ones become runs (``columns_of``), so an accepted record's
    outcome carries no key: no row would show it."""

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
        """``of`` for the usual outcome: every accepted record makes one, on the slot's hot path,
        so it is built in one step, without ``of``'s calls for the key, the error and the named tuple."""
        return _new_row(
            cls,
            (
                record.topic,
                record.partition,
                record.offset,
                None,
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
            None if outcome == ACCEPTED else key_text(record),
            record.delivery_count,
            outcome,
            error_text(failure),
            latency_ms,
            inflight,
        )


_new_row = tuple.__new__  # a row from its fields at once, past the named tuple's own __new__


# One list per OUTCOME_ARROW column, all as long: the rows a task hands over, built column by
# column (a row per record cost a tuple and a dozen reads, a third of a quick share poll's time).
OutcomeColumns = tuple[list[Any], ...]

_FIELDS = [itemgetter(i) for i in range(len(Outcome._fields))]
_TOPIC, _PARTITION, _OFFSET, _KEY, _DELIVERY, _OUTCOME, _ERROR, _LATENCY, _INFLIGHT = _FIELDS


def latency_counts(latencies_ms: Sequence[float]) -> list[int]:
    """Records per latency bucket (``LATENCY_SLOTS`` counts), each latency placed as the
    metrics' histogram places it (in the first bucket whose bound it does not pass), in C-level
    passes: no Python code runs per record."""
    counted = Counter(map(bisect_left, repeat(LATENCY_BUCKETS), map(truediv, latencies_ms, repeat(1000.0))))
    return [counted[i] for i in range(LATENCY_SLOTS)]


def columns_of(rows: list[Outcome]) -> OutcomeColumns:
    """Records' outcomes as the rows a task hands over: the accepted in runs, every other a row
    of its own (in the order given). Each field is read in one C-level pass over the outcomes."""
    if not rows:
        return _empty()
    accepted_mask = list(map(ACCEPTED.__eq__, map(_OUTCOME, rows)))
    accepted = accepted_mask.count(True)
    if accepted == len(rows):
        return _runs_of(rows)
    if not accepted:
        return _singles(rows)
    return joined_columns(
        [
            _runs_of(list(compress(rows, accepted_mask))),
            _singles(list(compress(rows, map(not_, accepted_mask)))),
        ]
    )


def accepted_columns(messages: list[Message], latency_ms: float, inflight: list[int]) -> OutcomeColumns:
    """The rows of messages all accepted at once, after one latency (a share poll's): each
    field read in one C-level pass over the messages, and a poll of one partition's consecutive
    records, the usual one, a single row with no Python code run per message."""
    # A polled message has its topic, partition and offset; a delivery count only once it has one.
    deliveries: list[Any] = list(map(Message.delivery_count, messages))
    if None in deliveries:
        deliveries = [delivery or 1 for delivery in deliveries]  # no count yet: a first delivery
    fields: list[list[Any]] = [list(map(read, messages)) for read in (Message.topic, Message.partition, Message.offset)]
    topics, partitions, offsets = fields
    return _runs(topics, partitions, offsets, deliveries, latency_ms, inflight)


def accepted_runs(records: list[Record], latencies_ms: list[float], inflights: list[int]) -> OutcomeColumns:
    """The rows of records accepted one by one (each with its latency and calls in flight): each
    field read in one C-level pass over the records, with no outcome made per record."""
    fields: list[list[Any]] = [list(map(read, records)) for read in _RECORD_FIELDS]
    topics, partitions, offsets, deliveries = fields
    return _runs(topics, partitions, offsets, deliveries, latencies_ms, inflights)


_RECORD_FIELDS = [attrgetter(name) for name in ("topic", "partition", "offset", "delivery_count")]


def _runs_of(rows: list[Outcome]) -> OutcomeColumns:
    return _runs(
        list(map(_TOPIC, rows)),
        list(map(_PARTITION, rows)),
        list(map(_OFFSET, rows)),
        list(map(_DELIVERY, rows)),
        list(map(_LATENCY, rows)),
        list(map(_INFLIGHT, rows)),
    )


def _runs(
    topics: list[str],
    partitions: list[int],
    offsets: list[int],
    deliveries: list[int],
    latencies: list[float] | float,
    inflights: list[int],
) -> OutcomeColumns:
    """Accepted records (each a place in these lists) as rows, one a run.

    ``latencies``: each record's, or one for them all. The records are taken a partition at a
    time, as they come (a stretch of one topic and partition); a stretch whose offsets are
    distinct and span exactly its length at one delivery count is one run, found with C-level
    passes only. Any other stretch is sorted by offset and cut where an offset does not follow
    the last or the delivery count changes.
    """
    columns = _empty()
    count = len(offsets)
    if not count:
        return columns
    if topics.count(topics[0]) == count and partitions.count(partitions[0]) == count:
        stretches = [(0, count)]
    else:
        ends = list(accumulate(len(list(group)) for _, group in groupby(zip(topics, partitions, strict=True))))
        stretches = list(zip([0, *ends[:-1]], ends, strict=True))
    for start, end in stretches:
        firsts, counts, size = offsets[start:end], deliveries[start:end], end - start
        low, high = min(firsts), max(firsts)
        if high - low + 1 == size and counts.count(counts[0]) == size and (size == 1 or len(set(firsts)) == size):
            taken = latencies[start:end] if isinstance(latencies, list) else latencies
            _add_run(columns, topics[start], partitions[start], low, high, counts[0], taken, max(inflights[start:end]))
            continue
        order = sorted(range(start, end), key=offsets.__getitem__)
        cuts = [
            n
            for n in range(1, size)
            if offsets[order[n]] != offsets[order[n - 1]] + 1 or deliveries[order[n]] != deliveries[order[n - 1]]
        ]
        for a, b in zip([0, *cuts], [*cuts, size], strict=True):
            run = order[a:b]
            first = run[0]
            taken = [latencies[i] for i in run] if isinstance(latencies, list) else latencies
            calls = max(inflights[i] for i in run)
            _add_run(
                columns,
                topics[first],
                partitions[first],
                offsets[first],
                offsets[run[-1]],
                deliveries[first],
                taken,
                calls,
            )
    return columns


def _add_run(
    columns: OutcomeColumns,
    topic: str,
    partition: int,
    first: int,
    last: int,
    delivery: int,
    latencies: list[float] | float,
    inflight: int,
) -> None:
    """One run's row: ``latencies`` its records' (or one for each of them)."""
    size = last - first + 1
    if isinstance(latencies, list):
        buckets, total = latency_counts(latencies), sum(latencies)
    else:
        buckets = [0] * LATENCY_SLOTS
        buckets[bisect_left(LATENCY_BUCKETS, latencies / 1000.0)] = size
        total = latencies * size
    for column, value in zip(
        columns,
        (topic, partition, first, last, size, None, delivery, ACCEPTED, None, total, buckets, inflight),
        strict=True,
    ):
        column.append(value)


def _singles(rows: list[Outcome]) -> OutcomeColumns:
    """A row each, column by column."""
    count = len(rows)
    offsets = list(map(_OFFSET, rows))
    return (
        list(map(_TOPIC, rows)),
        list(map(_PARTITION, rows)),
        offsets,
        offsets.copy(),
        [1] * count,
        list(map(_KEY, rows)),
        list(map(_DELIVERY, rows)),
        list(map(_OUTCOME, rows)),
        list(map(_ERROR, rows)),
        list(map(_LATENCY, rows)),
        [None] * count,
        list(map(_INFLIGHT, rows)),
    )


def _empty() -> OutcomeColumns:
    return tuple([] for _ in OUTCOME_ARROW)


def joined_columns(blocks: list[OutcomeColumns]) -> OutcomeColumns:
    """Blocks of columns one after another, as one block."""
    if len(blocks) == 1:
        return blocks[0]
    return tuple(list(chain.from_iterable(block[i] for block in blocks)) for i in range(len(OUTCOME_ARROW)))


def each_record(block: OutcomeColumns) -> Iterator[tuple[int, int, int, str]]:
    """(partition, offset, delivery count, outcome) of every record the block's rows stand for."""
    for partition, first, last, delivery, outcome in zip(
        block[PARTITION_COLUMN],
        block[OFFSET_COLUMN],
        block[LAST_OFFSET_COLUMN],
        block[DELIVERY_COLUMN],
        block[OUTCOME_COLUMN],
        strict=True,
    ):
        for offset in range(first, last + 1):
            yield partition, offset, delivery, outcome


def outcome_batch(rows: list[Outcome]) -> pa.RecordBatch:
    """Records' outcomes as one Arrow batch of OUTCOME_ARROW (the accepted in runs)."""
    return columns_batch([columns_of(rows)])


def columns_batch(blocks: list[OutcomeColumns]) -> pa.RecordBatch:
    """Blocks of outcome columns, one after another, as one Arrow batch of OUTCOME_ARROW."""
    columns = joined_columns(blocks) if blocks else _empty()
    return pa.RecordBatch.from_arrays(
        [arrow_column(values, f.type) for values, f in zip(columns, OUTCOME_ARROW, strict=True)],
        schema=OUTCOME_ARROW,
    )


def outcome_counts(table: pa.Table) -> Counter[str]:
    """Records per outcome in a table of outcome rows: each row counts its ``records``."""
    if not table.num_rows:
        return Counter()
    sums = table.group_by("outcome").aggregate([("records", "sum")])
    return Counter(dict(zip(sums.column("outcome").to_pylist(), sums.column("records_sum").to_pylist(), strict=True)))


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
    if pa.types.is_list(kind):
        validity = validity_bitmap(values)
        lists = values if validity is None else [v if v is not None else () for v in values]
        offsets = array("i", [0])
        offsets.extend(accumulate(map(len, lists)))
        flat = array(_FIXED[kind.value_type], chain.from_iterable(lists))
        child = pa.Array.from_buffers(kind.value_type, len(flat), [None, pa.py_buffer(flat)])
        return pa.Array.from_buffers(kind, count, [validity, pa.py_buffer(offsets)], children=[child])
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
