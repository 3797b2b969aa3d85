"""A handler author's kit: call a handler as the worker would, without Spark or a broker.

A team tests its handler in milliseconds: build a ``Record`` from a value, a key and headers
(``make_record``), and hand it to a ``HandlerRunner``, which calls the handler as a worker
process does and returns the outcome the worker would record (``Verdict``):

- the call runs under the group type's deadline (consumer and kmq: ``lockDuration``; share:
  70% of it); past it the call is given up as ``Timeout``;
- what the handler returned is turned into the records the worker would write, and refused as
  the worker refuses it (``InvalidOutput``: wrong types, JSON that does not encode, a record
  larger than the topic takes);
- returning accepts; ``Reject`` and ``InvalidOutput`` dead-letter at once; ``Retry``, any other
  exception, ``sys.exit()`` and a timeout release the record for another delivery, and on the
  delivery that reaches ``deliveryLimit`` dead-letter it instead;
- the spec's ``processing.setup`` runs once before the first call, ``processing.teardown`` at
  ``close`` (or the end of a ``with`` block).

The outcomes are the words of the worker's outcome rows and ``queueplane run``'s counts:
``accepted``, ``released`` (another delivery: retried in place by a consumer group, released to
the broker by a share group, redelivered by kmq's tracker) and ``dlq``. A dead-lettered verdict
carries the error class and message its DLQ headers would.

What it cannot show: crashes of the process, the broker's own limits on the DLQ, ordering and
concurrency across records. Those are the integration tests' (tests/integration).

The pytest fixture is in ``queueplane.testing.pytest_plugin``. This package imports neither
Spark nor a Kafka client: ``queueplane try`` and a team's unit tests use it as it is.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from queueplane.handler_api import Handler, Hook, InvalidOutput, Record, Reject, outputs_of
from queueplane.run.dead_letters import Failure, dlq_headers
from queueplane.run.executor.handler import ProcessHooks, load_handler, load_hook
from queueplane.run.executor.outputs import output_record

__all__ = [
    "ACCEPTED",
    "DEAD_LETTERED",
    "GROUP_TYPES",
    "RELEASED",
    "HandlerRunner",
    "Verdict",
    "Written",
    "call",
    "make_record",
]

# The outcome rows' words (queueplane.run.outcomes, which imports pyarrow: not imported here).
ACCEPTED, RELEASED, DEAD_LETTERED = "accepted", "released", "dlq"
GROUP_TYPES = ("consumer", "share", "kmq")
# A share handler's deadline is this share of lockDuration (queueplane.run.share.settings).
SHARE_HANDLER_SHARE_OF_LOCK = 0.7
# Kafka's default max.message.bytes of a topic: the largest record batch it takes.
DEFAULT_MAX_RECORD_BYTES = 1_048_588
# About what a record batch of one record adds to its key, value and headers.
RECORD_BATCH_OVERHEAD = 70
DEFAULT_TOPIC = "test.topic"
DEFAULT_TIMESTAMP_MS = 1_700_000_000_000

# What the worker does after a delivery, by group type and outcome (ARCHITECTURE's table).
NEXT_STEP = {
    ("consumer", RELEASED): "retried in place after the retry backoff (the partition waits, order kept)",
    ("share", RELEASED): "released: the broker delivers it again, to any worker",
    ("kmq", RELEASED): "no end marker: the redelivery tracker delivers it again",
    ("consumer", DEAD_LETTERED): "written to the DLQ; the partition goes on",
    ("share", DEAD_LETTERED): "written to the DLQ, then rejected (archived by the broker)",
    ("kmq", DEAD_LETTERED): "written to the DLQ, then its end marker",
    ("consumer", ACCEPTED): "outputs written, then its offset committed",
    ("share", ACCEPTED): "outputs written, then acknowledged (ACCEPT)",
    ("kmq", ACCEPTED): "outputs written, then its end marker",
}


def _bytes(value: bytes | str | dict | list | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":")).encode()
    raise TypeError(f"{what} is bytes, str, or (a value) a dict or list as JSON; not {type(value).__name__}")


def make_record(
    value: bytes | str | dict | list | None,
    key: bytes | str | None = None,
    headers: Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]] | None = None,
    *,
    topic: str = DEFAULT_TOPIC,
    partition: int = 0,
    offset: int = 0,
    delivery_count: int = 1,
    timestamp: int = DEFAULT_TIMESTAMP_MS,
) -> Record:
    """A first delivery of a record, as the worker hands it to a handler.

    ``value`` and ``key`` as bytes, or str (UTF-8); a dict or list value as JSON. ``headers`` as
    a dict or as (name, value) pairs, the way Kafka keeps them (a name may repeat).
    """
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    return Record(
        key=_bytes(key, "a key"),
        value=_bytes(value, "a value"),
        headers=tuple((str(name), _bytes(header, f"header {name!r}")) for name, header in pairs),
        topic=topic,
        partition=partition,
        offset=offset,
        delivery_count=delivery_count,
        timestamp=timestamp,
    )


class Written(NamedTuple):
    """A record the worker would write for an accepted record: its topic, key, value and headers."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def json(self) -> Any:
        return json.loads(self.value or b"")

    def text(self) -> str:
        return (self.value or b"").decode("utf-8")


@dataclass(frozen=True)
class Verdict:
    """One delivery's outcome, as the worker would record it."""

    outcome: str  # ACCEPTED, RELEASED or DEAD_LETTERED
    group_type: str
    record: Record
    outputs: list[Written] = field(default_factory=list)  # written only when accepted
    error_class: str | None = None
    error_message: str | None = None
    deliveries: int = 1  # the deliveries it took (HandlerRunner.handle)
    latency_ms: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.outcome == ACCEPTED

    @property
    def retried(self) -> bool:
        """Released for another delivery."""
        return self.outcome == RELEASED

    @property
    def dead_lettered(self) -> bool:
        return self.outcome == DEAD_LETTERED

    @property
    def error(self) -> str | None:
        """``Class: message``, as the outcome rows and ``queueplane run`` show it."""
        return f"{self.error_class}: {self.error_message}" if self.error_class is not None else None

    @property
    def next_step(self) -> str:
        """What the worker does next with the record."""
        return NEXT_STEP[(self.group_type, self.outcome)]

    def dead_letter_headers(self) -> dict[str, str]:
        """The headers the DLQ record adds (attempt times are the worker's clock: left out)."""
        if not self.dead_lettered or self.error_class is None:
            return {}
        r = self.record
        failure = Failure(self.error_class, self.error_message or "")
        added = dlq_headers(
            (),
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
            delivery_count=r.delivery_count,
            failure=failure,
            first_attempt_ms=0,
            last_attempt_ms=0,
        )
        return {k: v.decode("utf-8", "replace") for k, v in added if not k.endswith("attempt.ms")}

    def as_dict(self) -> dict[str, Any]:
        """Plain data (``queueplane try -o json``): bytes as UTF-8 text where they are, else as hex."""
        return {
            "key": _shown(self.record.key),
            "outcome": self.outcome,
            "deliveries": self.deliveries,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "next": self.next_step,
            "outputs": [_written_dict(w) for w in self.outputs],
            "dead_letter_headers": self.dead_letter_headers(),
        }


def _written_dict(written: Written) -> dict[str, Any]:
    headers = {name: _shown(value) for name, value in written.headers}
    return {"topic": written.topic, "key": _shown(written.key), "value": _shown(written.value), "headers": headers}


def _shown(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + data.hex()


class HandlerRunner:
    """Calls one handler as a worker process of a group type would, one delivery at a time.

    ``handler``: the callable, or ``module:function`` (imported from ``search_paths`` first).
    ``setup`` and ``teardown``: the spec's process hooks, callables or ``module:function``;
    setup runs before the first call, teardown at ``close``.
    """

    def __init__(
        self,
        handler: Handler | str,
        *,
        group_type: str = "consumer",
        lock_duration_s: float = 30.0,
        delivery_limit: int = 5,
        output_topic: str | None = None,
        setup: Hook | str | None = None,
        teardown: Hook | str | None = None,
        search_paths: Iterable[str] = (),
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ):
        if group_type not in GROUP_TYPES:
            raise ValueError(f"group_type is one of {', '.join(GROUP_TYPES)}; not {group_type!r}")
        if lock_duration_s <= 0 or delivery_limit < 1:
            raise ValueError("lock_duration_s is above 0 and delivery_limit at least 1")
        paths = list(search_paths)
        self.handler: Handler = load_handler(handler, paths) if isinstance(handler, str) else handler
        self.group_type = group_type
        self.lock_duration_s = lock_duration_s
        self.delivery_limit = delivery_limit
        self.output_topic = output_topic
        self.max_record_bytes = max_record_bytes
        hooks = [load_hook(h, paths) if isinstance(h, str) else h for h in (setup, teardown)]
        names = tuple(h if isinstance(h, str) else getattr(h, "__qualname__", "") for h in (setup, teardown))
        self.hooks = ProcessHooks(hooks[0], hooks[1], (str(names[0] or ""), str(names[1] or "")))

    @classmethod
    def from_spec(cls, path: str | Path, **overrides: Any) -> HandlerRunner:
        """A runner for a spec file's handler, hooks, group type, lockDuration, deliveryLimit and
        output topic. The spec is validated as ``queueplane validate`` does (offline): SpecInvalid
        lists its problems."""
        from queueplane.provision import steps  # the spec checks; imported only when a spec is read

        queues = steps.validate([str(path)])
        if len(queues) != 1:
            raise ValueError(f"{path}: expected one spec file, found {len(queues)}")
        queue = queues[0]
        settings: dict[str, Any] = {
            "group_type": queue.group.type,
            "lock_duration_s": queue.group.lock_duration_ms / 1000,
            "delivery_limit": queue.group.delivery_limit,
            "output_topic": queue.output_topic,
            "setup": queue.setup,
            "teardown": queue.teardown,
            "search_paths": queue.handler_search_paths,
        }
        settings.update(overrides)
        return cls(queue.handler, **settings)

    @property
    def deadline_s(self) -> float:
        """How long one call may run: lockDuration, or a share group's handler share of it."""
        if self.group_type == "share":
            return self.lock_duration_s * SHARE_HANDLER_SHARE_OF_LOCK
        return self.lock_duration_s

    def deliver(self, record: Record) -> Verdict:
        """One delivery of ``record``: the handler's call and what the worker would record of it."""
        self.hooks.start()
        started = time.monotonic()
        result: list[Any] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                result.append(self.handler(record))
            except BaseException as exc:  # Retry, any other exception, sys.exit(): classified below
                failure.append(exc)

        # On a thread of its own, as in the worker: a call past its deadline is given up, not waited for.
        thread = threading.Thread(target=run, name="qp-handler", daemon=True)
        thread.start()
        thread.join(self.deadline_s)
        latency_ms = (time.monotonic() - started) * 1000
        if thread.is_alive():
            return self._failed(record, Failure("Timeout", self._timeout_message()), False, latency_ms)
        if failure:
            exc = failure[0]
            return self._failed(record, Failure.of(exc), isinstance(exc, Reject), latency_ms)
        try:
            written = [Written(*output_record(o, record, self.output_topic)) for o in outputs_of(result[0])]
            for item in written:
                self._check_size(item)
        except Reject as exc:  # InvalidOutput: the same outputs on every delivery
            return self._failed(record, Failure.of(exc), True, latency_ms)
        except Exception as exc:  # outputs but no output topic: the worker fails the delivery
            return self._failed(record, Failure.of(exc), False, latency_ms)
        return Verdict(ACCEPTED, self.group_type, record, written, latency_ms=latency_ms)

    def handle(self, record: Record) -> Verdict:
        """Deliveries of ``record`` until it ends (accepted or in the DLQ), as the worker makes
        them, without the waits between them: the last delivery's verdict, with ``deliveries``."""
        delivery = record
        while True:
            verdict = self.deliver(delivery)
            if verdict.outcome != RELEASED or delivery.delivery_count >= self.delivery_limit:
                return replace(verdict, deliveries=delivery.delivery_count - record.delivery_count + 1)
            delivery = replace(delivery, delivery_count=delivery.delivery_count + 1)

    def close(self) -> None:
        """Teardown, if setup ran."""
        self.hooks.end()

    def __enter__(self) -> HandlerRunner:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _failed(self, record: Record, failure: Failure, rejected: bool, latency_ms: float) -> Verdict:
        final = rejected or record.delivery_count >= self.delivery_limit
        outcome = DEAD_LETTERED if final else RELEASED
        error_class, message = failure.error_class, failure.message
        return Verdict(outcome, self.group_type, record, [], error_class, message, latency_ms=latency_ms)

    def _timeout_message(self) -> str:
        lock = f"{self.lock_duration_s:g}s"
        if self.group_type == "consumer":
            return f"handler ran past its deadline of {lock}"
        if self.group_type == "kmq":
            return f"ran past lockDuration ({lock})"
        return "the handler ran past its deadline"

    def _check_size(self, item: Written) -> None:
        size = RECORD_BATCH_OVERHEAD + len(item.key or b"") + len(item.value or b"")
        size += sum(len(name.encode()) + len(value) for name, value in item.headers)
        if size > self.max_record_bytes:
            raise InvalidOutput(
                f"the record was refused: an output of about {size} bytes is larger than the "
                f"topic's max.message.bytes ({self.max_record_bytes})"
            )


def call(handler: Handler | str, record: Record | bytes | str | dict | list | None, **runner: Any) -> Verdict:
    """One delivery of ``record`` (a Record, or a value for ``make_record``) to ``handler``, with
    a ``HandlerRunner`` made of ``runner``'s arguments, set up and torn down around the call."""
    delivered = record if isinstance(record, Record) else make_record(record)
    with HandlerRunner(handler, **runner) as kit:
        return kit.deliver(delivered)
