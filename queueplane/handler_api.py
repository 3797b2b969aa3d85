"""The handler contract: what a team's handler takes, returns and raises. The public API.

A handler is one callable ``module:function`` (``spec.processing.handler``) that takes a
``Record``:

- returning accepts the record, optionally with outputs: None, an ``Output``, a value (bytes,
  str, a dict or list as JSON) or a list of them, written to ``processing.output.topic`` unless
  an ``Output`` names its own topic;
- raising ``Retry`` asks for another delivery; raising ``Reject`` sends the record to the
  dead-letter queue at once; any other exception (``sys.exit()`` too) counts as ``Retry``,
  because a bug fixed and redeployed should not lose records;
- a call that runs past its deadline counts as ``Retry``; the delivery that reaches
  ``group.deliveryLimit`` goes to the dead-letter queue instead;
- outputs that cannot be written (``InvalidOutput``, a ``Reject``) send the record to the
  dead-letter queue: the same record returns the same outputs on every delivery.

A spec may also name ``processing.setup`` and ``processing.teardown``, two callables taking no
arguments (``Hook``): setup runs once in each worker process before its first handler call
(connection pools, loaded models), teardown when the process drains or stops.

Docs, ``queueplane.testing`` and the runtimes import these names from here; ``queueplane``
re-exports the ones a handler needs. This module imports nothing heavy: handlers import it
inside executors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Handler", "Hook", "InvalidOutput", "Output", "Record", "Reject", "Retry", "outputs_of"]


class Retry(Exception):
    """Raise to ask for another delivery of this record (after backoff, or from the broker)."""


class Reject(Exception):
    """Raise when the record can never succeed (poison): it goes to the dead-letter queue now."""


class InvalidOutput(Reject):
    """What the handler returned cannot be written (a wrong type, or more than the topic takes).

    A Reject: the same record returns the same outputs on every delivery, so another delivery
    cannot help, and the record goes to the dead-letter queue with this as its error class.
    """


@dataclass(frozen=True)
class Record:
    """One delivery of one record, as the handler sees it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    topic: str
    partition: int
    offset: int
    delivery_count: int
    timestamp: int  # ms since the epoch, as Kafka stored it

    @classmethod
    def make(
        cls,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes | None], ...],
        topic: str,
        partition: int,
        offset: int,
        delivery_count: int,
        timestamp: int,
    ) -> Record:
        """The record with these fields, built without the frozen dataclass's ``__init__``.

        Runtimes build one per delivery; that ``__init__`` sets each field through
        ``object.__setattr__`` and cost three times this, a tenth of a trivial handler's record.
        """
        record = cls.__new__(cls)
        record.__dict__.update(
            key=key,
            value=value,
            headers=headers,
            topic=topic,
            partition=partition,
            offset=offset,
            delivery_count=delivery_count,
            timestamp=timestamp,
        )
        return record

    def text(self) -> str:
        return (self.value or b"").decode("utf-8")

    def json(self) -> Any:
        """The value parsed as JSON; invalid JSON raises Reject, since no retry can fix it."""
        try:
            return json.loads(self.value or b"")
        except ValueError as exc:
            raise Reject(f"value is not JSON: {exc}") from None

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Output(NamedTuple):
    """A record the handler wants written; topic None means the spec's output topic.

    A named tuple, not a frozen dataclass: a handler builds one per record, and the dataclass's
    ``__init__`` (each field set through ``object.__setattr__``) cost five times this. Immutable
    all the same; ``headers`` None is no headers, since a shared empty dict as the default would
    be one that any handler could change for all.
    """

    value: bytes | str | dict | list | None
    key: bytes | str | None = None
    headers: Mapping[str, bytes | str] | None = None
    topic: str | None = None

    def encoded(self) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
        """Key, value and headers as bytes; InvalidOutput for anything that is not writable."""
        value = self.value
        if isinstance(value, (dict, list)):
            try:
                value = json.dumps(value, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                raise InvalidOutput(f"the output value is not JSON-serialisable: {exc}") from None
        if self.headers is not None and not isinstance(self.headers, Mapping):
            raise InvalidOutput(f"output headers are a dict of str to bytes or str, not {type(self.headers).__name__}")
        headers = []
        for name, header in (self.headers or {}).items():
            if not isinstance(name, str):
                raise InvalidOutput(f"an output header name is {type(name).__name__}, not str")
            _bytes(name, "an output header name")  # text the client cannot encode would crash it (a segfault)
            headers.append((name, _bytes(header, f"output header {name!r}") or b""))
        if self.topic is not None and not isinstance(self.topic, str):
            raise InvalidOutput(f"the output topic is {type(self.topic).__name__}, not str")
        if self.topic is not None:
            _bytes(self.topic, "the output topic")
        return (_bytes(self.key, "the output key"), _bytes(value, "the output value"), headers)


def _bytes(value: object, what: str = "a value") -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidOutput(f"{what} is not valid text: {exc}") from None
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise InvalidOutput(f"{what} is {type(value).__name__}; outputs take bytes, str, or (values) a dict or list")


Handler = Callable[[Record], Any]
Hook = Callable[[], Any]  # processing.setup and processing.teardown


def outputs_of(result: Any) -> list[Output]:
    """What a handler returned, as outputs: None, one Output or value, or an iterable of them."""
    if result is None:
        return []
    if isinstance(result, Output):
        return [result]
    if isinstance(result, (bytes, str, dict)):
        return [Output(result)]
    if isinstance(result, Iterable):
        return [r if isinstance(r, Output) else Output(r) for r in result]
    raise InvalidOutput(f"a handler returns None, an Output, a value or a list of them; got {type(result).__name__}")
