"""The kmq markers topic: its record format, and the headers a redelivered message carries.

A marker says where one delivery of a queue record stands. Markers travel as small text
records on ``<topic>.markers``, in the partition of the queue records they are about, so the
markers of one message stay in order. One record carries the markers of a run of records
that share kind, delivery count, time and delay (a task's start markers, a round of end
markers): two marker records a message cost a kmq queue more than its handler did.

    key    "<partition>:<first offset>"
    value  "<kind> <delivery count> <at ms> <delay ms>[ <offsets>]"  ASCII, space separated, no headers

``<offsets>`` lists every offset the record is about as runs (``100-8432,8440``); without it
the record is about the key's offset alone.

``start`` is written (and flushed) before the handler runs; ``end`` once the record is
accepted with its outputs durable, or dead-lettered; ``retry`` when the handler asked for
another delivery (the tracker redelivers after ``delay ms`` instead of the lock timeout);
``release`` when the task gave the record to no handler call before its deadline (the task's
records outran the lock, or its start markers took that long to be acknowledged): the tracker
redelivers it without raising its delivery count, since no call was tried. A ``release`` that
reaches the tracker after it timed the delivery out changes nothing: the delivery is closed.
The tracker writes ``expired`` for a delivery it timed out and redelivered or dead-lettered:
it closes the delivery as ``end`` does, but the message is counted where its copy or its dead
letter is, never where the expired delivery was (resume.py).

A ``tick`` (key ``tick``, partition 0) carries no delivery. Versions whose tracker was a Spark
query wrote them to wake it; none is written now, and readers skip those still retained.

A redelivery is a new record on the queue topic: the original key, value and headers, with
the delivery count and the first attempt's time in the DLQ header names (queueplane.dlq),
and the original topic/partition/offset, so a dead-letter record points at the message as
first produced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from queueplane.run import dead_letters as dlq

START, END, RETRY, EXPIRED, RELEASE = "start", "end", "retry", "expired", "release"
KINDS = (START, END, RETRY, EXPIRED, RELEASE)
ENDS = (END, EXPIRED)  # the kinds that close a delivery
# An end marker may be written this share of lockDuration after its call ended (a task writes
# them in rounds, at moments when its producer holds nothing unacknowledged, and waits for such a
# moment no longer than this): so a call that ended just before its deadline may have its end
# marker written after it, and the tracker waits this long past a deadline before it redelivers.
LATE_END_SHARE = 0.2
TICK = "tick"  # no delivery: written by earlier versions to wake their tracker
# Offsets one marker record carries at most: a run of 10,000 scattered offsets is about 80 kB.
OFFSETS_PER_RECORD = 10_000


class Marker(NamedTuple):
    """One delivery's marker; marker records carry them in runs (``records``, ``decode``)."""

    partition: int  # of the queue record, and of the marker
    offset: int
    kind: str
    delivery_count: int
    at_ms: int
    delay_ms: int = 0


_KIND_NAMES = {kind.encode(): kind for kind in KINDS}


# What the markers of one run share: (partition, kind, delivery count, at ms, delay ms).
RunKey = tuple[int, str, int, int, int]


def records(markers: Iterable[Marker]) -> list[tuple[int, bytes, bytes]]:
    """The marker records for ``markers``, as (partition, key, value): one record per partition,
    kind, delivery count, time and delay, for up to ``OFFSETS_PER_RECORD`` offsets."""
    runs: dict[RunKey, list[int]] = {}
    for m in markers:
        runs.setdefault((m.partition, m.kind, m.delivery_count, m.at_ms, m.delay_ms), []).append(m.offset)
    return run_records(runs)


def run_records(runs: Mapping[RunKey, list[int]]) -> list[tuple[int, bytes, bytes]]:
    """``records`` for markers already gathered by what they share, each run's offsets in any
    order (sorted here, in place): a task gathers a batch's thousands of markers this way
    without a ``Marker`` each."""
    out = []
    for (partition, kind, count, at_ms, delay_ms), offsets in runs.items():
        offsets.sort()
        for i in range(0, len(offsets), OFFSETS_PER_RECORD):
            part = offsets[i : i + OFFSETS_PER_RECORD]
            value = (
                f"{kind} {count} {at_ms} {delay_ms}"
                if len(part) == 1
                else f"{kind} {count} {at_ms} {delay_ms} {_spans(part)}"
            )
            out.append((partition, message_id(partition, part[0]).encode(), value.encode()))
    return out


class MarkerRun(NamedTuple):
    """What one marker record says: the markers of ``offsets``, alike but for the offset."""

    partition: int
    kind: str
    delivery_count: int
    at_ms: int
    delay_ms: int
    offsets: list[int]


def decode_run(key: bytes, value: bytes | None) -> MarkerRun:
    """One marker record, its offsets in order."""
    if value is None:
        raise ValueError("a marker has a value")
    partition, _, first = key.partition(b":")
    fields = value.split(b" ")
    if len(fields) not in (4, 5):
        raise ValueError(f"a marker has 4 or 5 fields, not {len(fields)}")
    name = _KIND_NAMES.get(fields[0])
    if name is None:
        raise ValueError(f"unknown marker kind {fields[0]!r}")
    offsets = [int(first)] if len(fields) == 4 else _offsets(fields[4])
    return MarkerRun(int(partition), name, int(fields[1]), int(fields[2]), int(fields[3]), offsets)


def decode(key: bytes, value: bytes | None) -> list[Marker]:
    """The markers one marker record carries, in offset order."""
    run = decode_run(key, value)
    return [Marker(run.partition, o, run.kind, run.delivery_count, run.at_ms, run.delay_ms) for o in run.offsets]


def _spans(offsets: list[int]) -> str:
    """Sorted offsets as runs: ``5-9,12,14-15``."""
    spans, start, last = [], offsets[0], offsets[0]
    for offset in offsets[1:]:
        if offset != last + 1:
            spans.append(f"{start}-{last}" if last > start else str(start))
            start = offset
        last = offset
    spans.append(f"{start}-{last}" if last > start else str(start))
    return ",".join(spans)


def _offsets(text: bytes) -> list[int]:
    offsets: list[int] = []
    for span in text.split(b","):
        first, _, last = span.partition(b"-")
        offsets.extend(range(int(first), int(last or first) + 1))
    return offsets


def is_tick(key: bytes | None) -> bool:
    return key == TICK.encode()


def message_id(partition: int, offset: int) -> str:
    return f"{partition}:{offset}"


def _header(headers: tuple[tuple[str, bytes | None], ...] | list, name: str) -> str | None:
    for key, value in headers:
        if key == name and value is not None:
            return value.decode("ascii", "replace")
    return None


def delivery_count(headers: tuple[tuple[str, bytes | None], ...] | list) -> int:
    """This delivery's count: 1 for a message as produced, the header's value for a redelivery."""
    text = _header(headers, dlq.HEADER_DELIVERY_COUNT)
    return int(text) if text and text.isdigit() else 1


@dataclass(frozen=True)
class Origin:
    """Where a message was first produced, and when its first delivery started."""

    topic: str
    partition: int
    offset: int
    first_attempt_ms: int | None


def origin(headers: tuple[tuple[str, bytes | None], ...] | list, topic: str, partition: int, offset: int) -> Origin:
    """The message's first location: from a redelivery's headers, else where it is now."""
    first = _header(headers, dlq.HEADER_FIRST_ATTEMPT_MS)
    first_ms = int(first) if first and first.isdigit() else None
    source_offset = _header(headers, dlq.HEADER_SOURCE_OFFSET)
    if source_offset is None:
        return Origin(topic, partition, offset, first_ms)
    return Origin(
        _header(headers, dlq.HEADER_SOURCE_TOPIC) or topic,
        int(_header(headers, dlq.HEADER_SOURCE_PARTITION) or partition),
        int(source_offset),
        first_ms,
    )


def redelivery_headers(
    headers: tuple[tuple[str, bytes | None], ...] | list, where: Origin, count: int, first_attempt_ms: int
) -> list[tuple[str, bytes]]:
    """The original headers (queueplane's own dropped) plus the next delivery's count and the origin."""
    kept = [(k, v or b"") for k, v in headers if k not in dlq.DLQ_HEADERS]
    return [
        *kept,
        (dlq.HEADER_SOURCE_TOPIC, where.topic.encode()),
        (dlq.HEADER_SOURCE_PARTITION, str(where.partition).encode()),
        (dlq.HEADER_SOURCE_OFFSET, str(where.offset).encode()),
        (dlq.HEADER_DELIVERY_COUNT, str(count).encode()),
        (dlq.HEADER_FIRST_ATTEMPT_MS, str(first_attempt_ms).encode()),
    ]


def write_markers(producer: Any, topic: str, markers: list[Marker]) -> None:
    """Produce markers, each to its queue record's partition, and wait until all are durable."""
    from queueplane.run.outcomes import produce_and_wait

    made = records(markers)
    produce_and_wait(producer, [(topic, key, value, []) for _p, key, value in made], [p for p, _k, _v in made])
