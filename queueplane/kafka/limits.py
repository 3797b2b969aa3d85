"""The record-size limits of a queue's topics, read once when a worker starts."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka.admin import ConfigResource, ResourceType

from queueplane.kafka import clients
from queueplane.kafka.names import MAX_MESSAGE_BYTES
from queueplane.kafka.target import KafkaTarget

log = logging.getLogger("queueplane.worker")

PRODUCER_MAX_BYTES = 1_000_000  # librdkafka's message.max.bytes unless raised


def record_bounds(target: KafkaTarget, topics: Iterable[str], timeout_s: float = 10.0) -> tuple[int | None, int | None]:
    """The smallest and the largest ``max.message.bytes`` among ``topics`` that exist (None, None
    when none could be read), for a producer that writes to all of them.

    The smallest bounds its batches: the broker checks that limit per record batch, not per
    record, so a batch holding one record too large for the topic is refused whole and every
    record in it gets the same error; batches within the limit make that error name one record
    only, and the worker sends that record to the DLQ while the others are written. The largest
    bounds one record: librdkafka refuses a record over its own ``message.max.bytes`` (1 MB)
    before any broker sees it, so a dead letter of a record the queue took must be let through.
    """
    limits = _record_limits(target, topics, timeout_s)
    return (min(limits), max(limits)) if limits else (None, None)


def producer_record_bytes(largest: int | None) -> dict[str, int]:
    """librdkafka's ``message.max.bytes`` for a producer whose topics take records up to ``largest``."""
    return {"message.max.bytes": max(PRODUCER_MAX_BYTES, largest)} if largest else {}


def largest_record(target: KafkaTarget, topics: Iterable[str], timeout_s: float = 10.0) -> int | None:
    """The largest ``max.message.bytes`` among ``topics``: what a producer that copies records between
    them must let through (its own limit, ``message.max.bytes``, is 1 MB unless raised)."""
    limits = _record_limits(target, topics, timeout_s)
    return max(limits) if limits else None


def _record_limits(target: KafkaTarget, topics: Iterable[str], timeout_s: float) -> list[int]:
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in dict.fromkeys(topics)]
    if not resources:
        return []
    limits: list[int] = []
    try:
        admin = clients.admin(dict(target.settings))
        futures = admin.describe_configs(resources, request_timeout=timeout_s)
        for resource, future in futures.items():
            try:
                entry = future.result(timeout=timeout_s + 1).get(MAX_MESSAGE_BYTES)
            except Exception as exc:  # a topic not there yet: the broker's default applies
                log.debug("no %s for %s: %s", MAX_MESSAGE_BYTES, resource.name, exc)
                continue
            if entry is not None and entry.value is not None:
                limits.append(int(entry.value))
    except Exception as exc:
        log.warning("could not read %s of %s (%s): producers keep their defaults", MAX_MESSAGE_BYTES, topics, exc)
        return []
    return limits
