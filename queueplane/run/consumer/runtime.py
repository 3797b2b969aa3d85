"""Consumer groups on the driver: members of the group in the Python workers, leased by time slices.

Each Python worker process of the queue is a member of its consumer group (member.py), so the
group, not Spark, keeps the position: its committed offsets. The streaming query reads the
members' time-slice source (source.py), whose micro-batches collect the outcome rows of what the
members committed. A stop and a scale-down drain: the last batch finishes every task, commits
and leaves the group, and a scale-down waits until the group is empty of its members.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, ClassVar

from queueplane.kafka import clients
from queueplane.kafka.group_protocol import group_protocol
from queueplane.kafka.target import KafkaTarget
from queueplane.run.consumer.executor.process import ConsumerSettings, MemberSettings, transactional_producer
from queueplane.run.driver.runtime import QueueRuntime
from queueplane.run.settings import QueueSettings
from queueplane.spec.model import QueueSpec

SLICE_MS = 1000  # a member's time slice: how often its committed rows come out
IDLE_SLICE_MS = 15_000  # an idle member's slice, cut short when rows come
# After a draining batch, how long until members that had no task in it have left too.
DRAIN_SETTLE_S = 3.0 + 3.0 + 1.0


def consumer_settings(queue: QueueSpec, target: KafkaTarget, protocol: str = "classic") -> ConsumerSettings:
    slots = 1 if queue.group.ordering == "partition" else queue.concurrency
    return ConsumerSettings(
        **QueueSettings.common(queue, target),
        ordering=queue.group.ordering,
        slots=slots,
        # maxInFlight bounds the records a partition has taken but not finished: split over its slots.
        slot_queue=max(1, queue.group.max_in_flight // slots),
        backoff_ms=queue.retry_backoff_ms,
        max_backoff_ms=queue.retry_max_backoff_ms,
        exactly_once=queue.exactly_once,
        topic=queue.topic.name,
        start_from="earliest" if queue.group.start_from == "earliest" else "latest",
        group_protocol=protocol,
    )


def fence_partitions(settings: ConsumerSettings, topic: str, partitions: int) -> None:
    """exactlyOnce: abort what a killed worker left open, so the group's offsets can be read at once.

    Until then a read_committed offset fetch waits for the open transaction to time out.
    """
    for partition in range(partitions):
        transactional_producer(settings, topic, partition).flush(1)


class ConsumerRuntime(QueueRuntime):
    group_type: ClassVar[str] = "consumer"
    drains: ClassVar[bool] = True
    drain_settle_s: ClassVar[float] = DRAIN_SETTLE_S
    batches_only_on_input: ClassVar[bool] = False  # every trigger is a new time slice

    @staticmethod
    def executor_cap(queue: QueueSpec) -> int | None:
        """Executors beyond partitions x key slots over an executor's cores would get no work."""
        key_slots = queue.concurrency if queue.group.ordering == "key" else 1
        cores = max(1, int(queue.executor.get("cores", 1)))
        return max(1, math.ceil(queue.topic.partitions * key_slots / cores))

    def local_threads(self) -> int:
        return self.options.tasks or max(os.cpu_count() or 2, 2)

    @property
    def longest_batch_s(self) -> float | None:
        """Each task holds its member's lease one slice, the idle slice at most; tasks beyond the
        cores run in turns: locally none are (a task thread per task, up to a member per
        partition), on executors the tasks are sized for the most and the fewest may run."""
        queue, options = self.queue, self.options
        slice_s = max(options.batch_ms or SLICE_MS, IDLE_SLICE_MS) / 1000
        if options.local:
            return slice_s
        cores = max(1, int(queue.executor.get("cores", 1)))
        tasks = min(queue.topic.partitions, options.tasks or queue.max_executors * cores)
        return slice_s * math.ceil(tasks / (max(1, queue.min_executors) * cores))

    def group_members(self) -> int | None:
        """Members of the group now: none once a drain has made every member leave."""
        admin = clients.admin(self.target)
        group = self.queue.group.id
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        return len(described.members)

    def member_settings(self, protocol: str, tasks: int) -> MemberSettings:
        """What the members of the queue's group get (``protocol``: the group protocol to use;
        ``tasks``: the members a micro-batch leases)."""
        queue = self.queue
        settings = consumer_settings(queue, self.target, protocol)
        if queue.exactly_once:
            fence_partitions(settings, queue.topic.name, queue.topic.partitions)
        return settings

    def member_source(self) -> type[Any]:
        """The time-slice source whose tasks lease this group type's members."""
        from queueplane.run.consumer.source import MemberSource

        return MemberSource

    def stream(self, spark: Any, drain_file: Path, executor_ceiling: int | None) -> Any:
        from queueplane.run.consumer.source import register_source

        queue, target, options = self.queue, self.target, self.options
        cores = int(queue.executor.get("cores", 1))
        partitions = queue.topic.partitions
        if executor_ceiling is not None:  # tasks for the most executors; with fewer, they run in turns
            tasks = options.tasks or executor_ceiling * cores
        elif options.local:
            # A member per task thread, up to one per partition.
            tasks = options.tasks or max(1, min(partitions, self.local_threads()))
        else:
            tasks = options.tasks or spark.sparkContext.defaultParallelism
        tasks = max(1, min(tasks, partitions))
        settings = dataclasses.replace(
            self.member_settings(group_protocol(target.settings), tasks),
            batch_ms=options.batch_ms or SLICE_MS,
            fair_share=math.ceil(partitions / tasks),
        )
        if options.max_batch_records:
            settings = dataclasses.replace(settings, max_uncommitted=max(1, options.max_batch_records // tasks))
        source = register_source(spark, queue.name, self.member_source())
        return (
            spark.readStream.format(source)
            .option("settings", settings.to_json())
            .option("tasks", str(tasks))
            .option("partitions", str(partitions))
            .option("drain_file", str(drain_file))
            .load()
        )
