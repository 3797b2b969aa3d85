"""The failed writes of a process's shared producer, reported by one callback for all its writes.

A delivery callback given with each write (a closure naming its record) cost more than a
trivial handler's whole call, and all but a few writes succeed. So a writer hands records to
the producer without one, and the producer reports every failure here instead: a refusal (a
record the broker will not take however often it is sent: too large, invalid) under the
fingerprint of the record, for the writer that holds the same fingerprint to claim; any other
failure as a count, which a writer compares with the count it saw before its writes.

A refusal reaches here before the producer stops counting its record as unacknowledged, so a
writer that waited for the producer to acknowledge everything it wrote finds its refusals here.

A refusal reported for a record written beside others is only a suspicion. The broker checks a
topic's ``max.message.bytes`` per record batch and refuses a batch whole, and librdkafka reports
every record of it refused: a small record batched with a big one looks refused too. Producers
keep batches within their topics' limits (``ServedProducer``'s ``batch_bytes``), but only for the
limits read when the worker started, of the topics it knew then: a limit lowered since, one the
worker could not read, or a topic a handler names itself leaves records sharing a refused batch.
So before a runtime turns a record into a dead letter, or parks a dead letter, because a write of
it was refused, it writes the suspect again alone (``AloneWrites``): only a record refused in a
batch of its own is refused for certain; one taken alone is written, a success like any other.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Producer

from queueplane.handler_api import InvalidOutput
from queueplane.kafka import clients
from queueplane.run.outcomes import DELIVERY_TIMEOUT_S, ProducedRecord, produce, refused_write

log = logging.getLogger("queueplane.worker")

# Refusals nobody claims (their writer's task failed first, and its retry writes anew) would
# otherwise pile up for the life of the process; past this many, the oldest go.
MAX_UNCLAIMED = 10_000


def fingerprint(topic: str, key: bytes | None, value: bytes | None) -> int:
    """What a writer and the failure report of its record agree on: the record as written.

    Outputs are bytes by the time they are produced (outputs.output_record), and the report
    gives the same bytes back, so both sides hash equal objects.
    """
    return hash((topic, key, value))


def fingerprints(produced: list[ProducedRecord]) -> tuple[int, ...]:
    if len(produced) == 1:  # the usual record: one output, without a list to build
        topic, key, value, _ = produced[0]
        return (fingerprint(topic, key, value),)
    return tuple([fingerprint(topic, key, value) for topic, key, value, _ in produced])


class FailedWrites:
    """The producer's delivery callback (errors only) and what it learnt, for the writers to read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors = 0  # failures that were not refusals, since the process started
        self.last_error = ""
        self.failures = 0  # every failure, refusals too, for a writer that fails on any
        self.last_failure = ""
        self._refused: dict[int, list[InvalidOutput]] = {}

    def __call__(self, err: Any, msg: Any) -> None:
        """On the producer's delivery thread, once for each write that failed."""
        why = refused_write(err)
        with self._lock:
            self.failures += 1
            self.last_failure = f"a write to {msg.topic()} failed: {why or err}"
            if why is None:
                self.errors += 1
                self.last_error = f"a write to {msg.topic()} failed: {err}"
                return
            if len(self._refused) >= MAX_UNCLAIMED:
                del self._refused[next(iter(self._refused))]
            self._refused.setdefault(fingerprint(msg.topic(), msg.key(), msg.value()), []).append(why)

    @property
    def refusals(self) -> int:
        """Refusals not claimed yet. Read without the lock: once the producer acknowledged a
        write, its refusal, if any, is in already."""
        return len(self._refused)

    def claim_each(self, produced: list[ProducedRecord]) -> list[tuple[ProducedRecord, InvalidOutput]]:
        """The records of ``produced`` reported refused, each with why (claimed, as ``claim``)."""
        found: list[tuple[ProducedRecord, InvalidOutput]] = []
        with self._lock:
            for item in produced:
                topic, key, value, _ = item
                print_ = fingerprint(topic, key, value)
                whys = self._refused.get(print_)
                if whys:
                    found.append((item, whys.pop()))
                    if not whys:
                        del self._refused[print_]
        return found

    def claim(self, written: Iterable[int]) -> InvalidOutput | None:
        """Why one of these writes (fingerprints) was refused, or None. Each refusal is claimed once:
        two records that wrote the same bytes, both refused, each claim one."""
        found = None
        with self._lock:
            for print_ in written:
                whys = self._refused.get(print_)
                if whys:
                    found = whys.pop()
                    if not whys:
                        del self._refused[print_]
        return found


# A producer that writes one record a batch: what it is refused, the broker refused in that record.
ALONE_ROLE: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 0, "batch.num.messages": 1}


class AloneWrites:
    """Writes a suspect (a record reported refused beside others) again in a batch of its own.

    A producer of its own, made on first use (refusals are rare), used by one caller at a time:
    it is flushed before the suspect is handed to it and after, and takes one record a batch, so
    no other write shares the suspect's batch. The answer is certain either way: refused alone,
    the record itself is over its topic's limit (or invalid); taken, it is written once (the
    batch it shared was refused whole, so nothing of it landed before).
    """

    def __init__(self, make_producer: Callable[[], Producer]):
        self._make_producer = make_producer
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def refusal(self, record: ProducedRecord, partition: int | None = None) -> InvalidOutput | None:
        """Write ``record`` alone (pinned to ``partition`` when given): None when the broker took
        it, why when it refused it. Any other failure, or no answer within DELIVERY_TIMEOUT_S,
        raises RuntimeError: the caller treats it as it treats a failed write."""
        topic = record[0]
        with self._lock:
            if self._producer is None:
                self._producer = self._make_producer()
            producer = self._producer
            if producer.flush(DELIVERY_TIMEOUT_S):
                raise RuntimeError(f"a write to {topic} found its producer busy for {DELIVERY_TIMEOUT_S:.0f}s")
            reports: list[Any] = []
            try:
                produce(producer, record, lambda err, _msg: reports.append(err), serve=True, partition=partition)
            except InvalidOutput as refused:  # refused by the client before it was sent: alone already
                return refused
            if producer.flush(DELIVERY_TIMEOUT_S) or not reports:
                raise RuntimeError(f"a write to {topic} was not acknowledged within {DELIVERY_TIMEOUT_S:.0f}s")
        error = reports[0]
        if error is None:
            log.info(
                "a write to %s reported refused with its record batch was taken alone: "
                "the batch held another record too large for the topic",
                topic,
            )
            return None
        why = refused_write(error)
        if why is None:
            raise RuntimeError(f"a write to {topic} failed: {error}")
        return why

    def first_refusal(self, records: list[ProducedRecord], partition: int | None = None) -> InvalidOutput | None:
        """Write ``records`` (one record's suspects) alone, one after another, until one is refused:
        why, or None when all were taken. Those after a refused one are not written: their record
        becomes a dead letter."""
        for record in records:
            why = self.refusal(record, partition)
            if why is not None:
                return why
        return None

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.flush(DELIVERY_TIMEOUT_S)


_ALONE: dict[str, AloneWrites] = {}
_ALONE_LOCK = threading.Lock()


def alone_writes(kafka: Mapping[str, Any]) -> AloneWrites:
    """The process's ``AloneWrites`` for the cluster settings ``kafka`` (the same for every task
    of a queue), made on first use; its producer is made only when a suspect comes."""
    key = json.dumps(dict(kafka), sort_keys=True, default=str)
    with _ALONE_LOCK:
        found = _ALONE.get(key)
        if found is None:
            settings = dict(kafka)
            found = _ALONE[key] = AloneWrites(lambda: clients.producer(settings, ALONE_ROLE))
        return found
