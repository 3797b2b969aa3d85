"""What a record read from a partition always has, where confluent-kafka's types allow less.

One class, ``Message``, serves consumed records, error events and messages a producer has not
sent yet, so its types make every field optional: ``offset()`` is None until a broker gave the
message one, ``partition()`` while none is chosen, ``topic()`` for an error about no topic, and
``headers()`` is typed as what ``produce()`` accepts (a dict, or pairs with str values). A
message that ``poll()`` or ``consume()`` returned with no ``error()`` is a record of a partition:
it has a topic, a partition and an offset, and its headers are (name, bytes or None) pairs.

These functions say so once, for callers that have checked ``error()``. Given an error event or
an unsent message they raise rather than let a None travel on into arithmetic or a DLQ header.
A record's key and value stay optional: a record may have neither (a tombstone has no value).
"""

from __future__ import annotations

from typing import TypeVar, cast

from confluent_kafka import Message

_T = TypeVar("_T")

Headers = list[tuple[str, bytes | None]]  # a consumed record's headers, in the order they came


class NotARecord(TypeError):
    """A message without a place in a partition (an error event, or one not produced yet) where
    the caller needs a record read from one: a bug in the caller, not in the data."""


def _present(value: _T | None, field: str, message: Message) -> _T:
    if value is None:
        raise NotARecord(f"a message without {field} (error: {message.error()}) where a consumed record was expected")
    return value


def topic_of(message: Message) -> str:
    """The topic a consumed record was read from."""
    return _present(message.topic(), "a topic", message)


def partition_of(message: Message) -> int:
    """The partition a consumed record was read from."""
    return _present(message.partition(), "a partition", message)


def offset_of(message: Message) -> int:
    """A consumed record's offset in its partition."""
    return _present(message.offset(), "an offset", message)


def headers_of(message: Message) -> Headers:
    """A consumed record's headers (empty when it has none). The client builds them as a list of
    (str, bytes or None) pairs; a dict, or str values, are only ever what a caller passes to
    ``produce()``, and the cast states that for the pairs."""
    headers = message.headers()
    if headers is None:
        return []
    if isinstance(headers, dict):
        raise NotARecord("a message with headers as a dict (what produce() takes) where a consumed record was expected")
    return cast(Headers, headers)
