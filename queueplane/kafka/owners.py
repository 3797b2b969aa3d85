"""Which queue owns which topic and group: a small compacted topic on the cluster itself.

Kafka topics carry no labels, yet plan must tell a topic queueplane created for a queue from
one that was there before (another application's, or another queue's). Apply records each
topic it creates, or that a spec adopts, as one record keyed by the topic's name, before it
creates or changes anything; plan reads them back. Group ids are claimed the same way (a
group belongs to one queue: two queues in one group steal each other's records, and another
team's worker in it reads that team's data), and so are the ACLs apply creates for a queue
(provision/acls.py). The record lives on the cluster, not in
a file, so every checkout, CI runner and Airflow worker sees the same owners.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from queueplane.kafka import clients
from queueplane.kafka.consumed import offset_of
from queueplane.kafka.names import CLEANUP_POLICY
from queueplane.kafka.target import KafkaTarget

# Kafka's internal-topic rule (names.is_internal_topic) keeps every spec away from it.
OWNERS_TOPIC = "_queueplane-owners"
ACLS_KEY = "acls:"  # + team/name: the ACLs apply created for that queue
GROUP_KEY = "group:"  # + group id: the queue that group belongs to
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Owner:
    """The queue a topic belongs to: ``team/name``, and the spec that claimed it."""

    queue: str
    spec: str
    role: str


def _unknown_topic(exc: KafkaException) -> bool:
    code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
    return code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION)


def read_records(target: KafkaTarget) -> dict[str, dict[str, Any]]:
    """Every record, the latest per key (none when nothing was ever recorded).

    Keys are topic names (an Owner each), ``group:<group id>`` (an Owner each) and
    ``acls:<team>/<name>`` (the ACLs apply made for a queue); a topic name cannot contain ':',
    so they never meet.
    """
    consumer = clients.consumer(
        target, {"group.id": "queueplane-owners-reader", "enable.auto.commit": False, "enable.partition.eof": True}
    )
    try:
        partition = TopicPartition(OWNERS_TOPIC, 0)
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=READ_TIMEOUT_S)
        except KafkaException as exc:
            if _unknown_topic(exc):
                return {}
            raise
        records: dict[str, dict[str, Any]] = {}
        if high <= low:
            return records
        consumer.assign([TopicPartition(OWNERS_TOPIC, 0, low)])
        deadline = time.monotonic() + READ_TIMEOUT_S
        position = low
        while position < high:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {OWNERS_TOPIC} took over {READ_TIMEOUT_S:.0f}s (at {position} of {high})")
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                raise KafkaException(error)
            position = offset_of(message) + 1
            key = (message.key() or b"").decode()
            value = message.value()
            if value is None:
                records.pop(key, None)
            else:
                records[key] = json.loads(value)
        return records
    finally:
        consumer.close()


def owners_in(records: dict[str, dict[str, Any]]) -> dict[str, Owner]:
    """The topic owners among the records."""
    return {key: Owner(**value) for key, value in records.items() if not key.startswith((ACLS_KEY, GROUP_KEY))}


def group_owners_in(records: dict[str, dict[str, Any]]) -> dict[str, Owner]:
    """The group owners among the records, by group id."""
    return {key.removeprefix(GROUP_KEY): Owner(**value) for key, value in records.items() if key.startswith(GROUP_KEY)}


def write_records(target: KafkaTarget, records: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """Write one record per key (creating the topic on first use); per key, the error text or None.
    Acknowledged by every in-sync replica before it returns."""
    if not records:
        return {}
    admin = clients.admin(target)
    created = admin.create_topics(
        [NewTopic(OWNERS_TOPIC, 1, -1, config={CLEANUP_POLICY: "compact"})],  # -1: the cluster's default
        request_timeout=READ_TIMEOUT_S,
    )[OWNERS_TOPIC]
    try:
        created.result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            return {key: f"cannot create {OWNERS_TOPIC}: {exc.args[0].str()}" for key in records}
    producer = clients.producer(target, {"acks": "all", "enable.idempotence": True})
    outcome: dict[str, str | None] = {}

    def delivered(err: KafkaError | None, message: Any) -> None:
        outcome[(message.key() or b"").decode()] = None if err is None else f"{err.name()}: {err.str()}"

    for key, value in sorted(records.items()):
        producer.produce(OWNERS_TOPIC, key=key.encode(), value=json.dumps(value).encode(), on_delivery=delivered)
    producer.flush(READ_TIMEOUT_S)
    return {key: outcome.get(key, "not acknowledged in time") for key in records}
