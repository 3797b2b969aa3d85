"""The kmq markers topic: its record format, and the headers a redelivered message carries.

A marker is one small record on ``<topic>.markers``, in the partition of the queue record
it is about, so the markers of one message stay in order:

    key    "<partition>:<offset>"                     the queue record (the tracker's state key)
    value  "<kind> <delivery count> <at ms> <delay ms>"  ASCII, space separated, no headers

``start`` is written (and flushed) before the handler runs; ``end`` once the record is
accepted with its outputs durable, or dead-lettered; ``retry`` when the handler asked for
another delivery (the tracker redelivers after ``delay ms`` instead of the lock timeout).
The tracker also writes ``end`` for a delivery it timed out and redelivered.

A ``tick`` (key ``tick``, partition 0) carries no delivery. Releases whose tracker was a Spark
query wrote them to wake it; none is written now, and readers skip those still retained.

A redelivery is a new record on the queue topic: the original key, value and headers, with
the delivery count and the first attempt's time in the DLQ header names (queueplane.dlq),
and the original topic/partition/offset, so a dead-letter record points at the message as
first produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from queueplane.run import dead_letters as dlq

START, END, RETRY = "start", "end", "retry"
KINDS = (START, END, RETRY)
# An end marker may be written this share of lockDuration after its call ended (a task writes
# them in rounds, at moments when its producer holds nothing unacknowledged, and waits for such a
# moment no longer than this): so a call that ended just before its deadline may have its end
# marker written after it, and the tracker waits this long past a deadline before it redelivers.
LATE_END_SHARE = 0.2
TICK = "tick"  # no delivery: written by earlier releases to wake their tracker


class Marker(NamedTuple):
    """One marker. A named tuple: the tracker decodes two of them per message."""

    partition: int  # of the queue record, and of the marker
    offset: int
    kind: str
    delivery_count: int
    at_ms: int
    delay_ms: int = 0

    def encode(self) -> tuple[bytes, bytes]:
        return message_id(self.partition, self.offset).encode(), (
            f"{self.kind} {self.delivery_count} {self.at_ms} {self.delay_ms}".encode()
        )

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Marker:
        partition, _, offset = key.partition(b":")
        kind, count, at_ms, delay_ms = value.split(b" ")
        name = _KIND_NAMES.get(kind)
        if name is None:
            raise ValueError(f"unknown marker kind {kind!r}")
        return cls(int(partition), int(offset), name, int(count), int(at_ms), int(delay_ms))


_KIND_NAMES = {kind.encode(): kind for kind in KINDS}


def is_tick(key: bytes | None) -> bool:
    return key == TICK.encode()


def message_id(partition: int, offset: int) -> str:
    return f"{partition}:{offset}"


def parse_id(text: str) -> tuple[int, int]:
    partition, _, offset = text.partition(":")
    return int(partition), int(offset)


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

    produce_and_wait(producer, [(topic, *m.encode(), []) for m in markers], [m.partition for m in markers])
