"""Dead-letter records: the original key, value and headers, plus why and where from.

Header names live here only; every runtime and the `dlq` tools read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER_SOURCE_TOPIC = "queueplane.source.topic"
HEADER_SOURCE_PARTITION = "queueplane.source.partition"
HEADER_SOURCE_OFFSET = "queueplane.source.offset"
HEADER_DELIVERY_COUNT = "queueplane.delivery.count"
HEADER_ERROR_CLASS = "queueplane.error.class"
HEADER_ERROR_MESSAGE = "queueplane.error.message"
HEADER_FIRST_ATTEMPT_MS = "queueplane.first.attempt.ms"
HEADER_LAST_ATTEMPT_MS = "queueplane.last.attempt.ms"

DLQ_HEADERS = (
    HEADER_SOURCE_TOPIC,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_OFFSET,
    HEADER_DELIVERY_COUNT,
    HEADER_ERROR_CLASS,
    HEADER_ERROR_MESSAGE,
    HEADER_FIRST_ATTEMPT_MS,
    HEADER_LAST_ATTEMPT_MS,
)
# On a dead letter the DLQ refused, kept in the queue's own topic until the DLQ takes it: its
# other headers are already the DLQ's, so a worker that meets it writes it to the DLQ as it is.
HEADER_PARKED = "queueplane.parked"
# Set by `queueplane dlq redrive` on a record it moves back to the queue topic.
HEADER_REDRIVE_FROM = "queueplane.redrive.from"  # dlq-topic/partition/offset it was moved from
HEADER_REDRIVE_COUNT = "queueplane.redrive.count"  # how many times this record has been redriven
REDRIVE_HEADERS = (HEADER_REDRIVE_FROM, HEADER_REDRIVE_COUNT)
MAX_ERROR_MESSAGE = 2000


@dataclass(frozen=True)
class Failure:
    """Why a delivery failed: the exception's class and message."""

    error_class: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        if isinstance(exc, Carried):
            return exc.failure
        return cls(type(exc).__qualname__, str(exc)[:MAX_ERROR_MESSAGE])


class Carried:
    """Mixed into an exception that stands for a failure raised elsewhere (a handler's call in a
    child process): ``Failure.of`` gives the original failure, its class name included."""

    failure: Failure


def dlq_headers(
    original: list[tuple[str, bytes | None]] | tuple[tuple[str, bytes | None], ...],
    *,
    topic: str,
    partition: int,
    offset: int,
    delivery_count: int,
    failure: Failure,
    first_attempt_ms: int,
    last_attempt_ms: int,
) -> list[tuple[str, bytes]]:
    """The original headers (earlier queueplane headers replaced) followed by this failure's."""
    kept = [(k, v or b"") for k, v in original if k not in DLQ_HEADERS]
    return [
        *kept,
        (HEADER_SOURCE_TOPIC, topic.encode()),
        (HEADER_SOURCE_PARTITION, str(partition).encode()),
        (HEADER_SOURCE_OFFSET, str(offset).encode()),
        (HEADER_DELIVERY_COUNT, str(delivery_count).encode()),
        (HEADER_ERROR_CLASS, failure.error_class.encode()),
        (HEADER_ERROR_MESSAGE, failure.message.encode("utf-8", "replace")),
        (HEADER_FIRST_ATTEMPT_MS, str(first_attempt_ms).encode()),
        (HEADER_LAST_ATTEMPT_MS, str(last_attempt_ms).encode()),
    ]


def failure_of_headers(headers: list[tuple[str, bytes | None]] | tuple[tuple[str, bytes | None], ...]) -> Failure:
    """The failure a dead letter's headers record (a parked record's, for its outcome row)."""
    found = {k: (v or b"").decode("utf-8", "replace") for k, v in headers if k in DLQ_HEADERS}
    return Failure(found.get(HEADER_ERROR_CLASS, "Unknown"), found.get(HEADER_ERROR_MESSAGE, ""))
