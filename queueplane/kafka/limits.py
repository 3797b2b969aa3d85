"""The record-size limits of a queue's topics, read once when a worker starts."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka.admin import ConfigResource, ResourceType

from queueplane.kafka import clients
from queueplane.kafka.target import KafkaTarget

log = logging.getLogger("queueplane.worker")

MAX_MESSAGE_BYTES = "max.message.bytes"
PRODUCER_MAX_BYTES = 1_000_000  # librdkafka's message.max.bytes unless raised


def smallest_record_batch(target: KafkaTarget, topics: Iterable[str], timeout_s: float = 10.0) -> int | None:
    """The smallest ``max.message.bytes`` among ``topics`` that exist; None when none could be read.

    The broker checks that limit per record batch, not per record: a batch holding one record
    too large for the topic is refused whole, and every record in it gets the same error. A
    producer whose batches stay within the limit makes that error name one record only, so a
    worker can send that record to the DLQ and the others are written.
    """
    limits = _record_limits(target, topics, timeout_s)
    return min(limits) if limits else None


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
