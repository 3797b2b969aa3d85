"""What the driver tells every runtime's tasks about a queue, sent as JSON (executors parse no spec)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from queueplane.kafka import clients
from queueplane.kafka.limits import largest_record, smallest_record_batch
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.model import QueueSpec


class JsonSettings:
    """A settings dataclass that travels to the executors as JSON."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls(**json.loads(text))


@dataclass(frozen=True, kw_only=True)
class QueueSettings(JsonSettings):
    """The fields every runtime's settings share; each group type's settings add their own."""

    # The cluster's settings, with message.max.bytes raised to the topics the worker writes (sized_for).
    kafka: dict[str, Any]
    queue: str
    group_id: str
    dlq_topic: str
    output_topic: str | None
    lock_ms: int
    delivery_limit: int
    handler: str
    search_paths: list[str] = field(default_factory=list)
    # The producer's batch.size: the smallest max.message.bytes of the output and DLQ topics.
    batch_bytes: int | None = None
    # processing.memoryLimit in MiB: a handler process past it ends itself (queueplane.run.executor.memory_guard).
    memory_limit_mi: int | None = None
    # processing.setup and processing.teardown: run once per worker process (queueplane.run.executor.processes).
    setup: str | None = None
    teardown: str | None = None

    @staticmethod
    def common(queue: QueueSpec, target: KafkaTarget) -> dict[str, Any]:
        """The shared fields' values, from the spec and the cluster.

        Every client of the worker's tasks is built from ``kafka``, so its producers (outputs,
        dead letters, parked records, kmq markers) take records as large as the largest topic
        they write, read from the broker now (``clients.sized_for``), not librdkafka's 1 MB.
        """
        return {
            "kafka": clients.sized_for(target.settings, largest_record(target, written_topics(queue))),
            "queue": queue.name,
            "group_id": queue.group.id,
            "dlq_topic": queue.dead_letter.name,
            "output_topic": queue.output_topic,
            "lock_ms": queue.group.lock_duration_ms,
            "delivery_limit": queue.group.delivery_limit,
            "handler": queue.handler,
            "setup": queue.setup,
            "teardown": queue.teardown,
            "search_paths": queue.handler_search_paths,
            "memory_limit_mi": queue.handler_memory_mi,
            "batch_bytes": smallest_record_batch(target, [queue.dead_letter.name, *filter(None, [queue.output_topic])]),
        }


def written_topics(queue: QueueSpec) -> list[str]:
    """Every topic a worker's tasks write: the DLQ, the queue's own (parked dead letters, kmq
    redeliveries), the spec's output topic and kmq's markers."""
    topics = [queue.dead_letter.name, queue.topic.name]
    if queue.output_topic:
        topics.append(queue.output_topic)
    if queue.markers is not None:
        topics.append(queue.markers.name)
    return topics
