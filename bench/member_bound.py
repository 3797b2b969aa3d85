"""The consumer runtime's slot path fed by consumers of its own, no Spark: the most such a worker reaches.

docs/design/consumer-throughput.md describes a consumer-group worker that leaves Spark's Kafka
source: each Python worker process joins the group with its own consumer and feeds what it
consumes to the runtime's ``PartitionTask`` (slots, retries in place, the crash journal, the
offset tracker, outcome rows, commits after the outputs are durable), Spark only leasing it time
slices. This side runs that path without Spark, so it bounds that design from above: one process
per core, as the plain loop runs, the partitions split between them, each consuming batches of up
to ``BATCH`` records and feeding them to one task per partition, finished and committed every
``SLICE_S`` as a time slice would end (all of a process's tasks at once, the process quiet until
their outputs are acknowledged: one producer serves them all). The partitions are assigned, not
subscribed: a worker's members must also finish their tasks before a rebalance takes a partition
away, which a bound can leave out. No Spark, no leases, no driver: a bound, not a worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.synchronize import Event

from confluent_kafka import TopicPartition
from plain_consumer_loop import spawned

from queueplane.handler_api import Record
from queueplane.kafka import clients
from queueplane.run.consumer.executor.partition import PartitionTask
from queueplane.run.consumer.executor.process import ConsumerSettings, WorkerProcess
from queueplane.run.executor.processes import tune_interpreter

BATCH = 2000  # records a consume() returns at most, as the plain loop's
WAIT_S = 0.2  # how long one consume() waits for a batch to fill; a stop request is seen within it
SLICE_S = 1.0  # how often a member's tasks finish, commit and start anew, as a time slice ends


def member(stop: Event, settings_json: str, topic: str, partitions: list[int]) -> None:
    """One member: consume its partitions, feed their tasks, finish them every slice, until ``stop``."""
    tune_interpreter()  # as in the worker's processes
    settings = ConsumerSettings.from_json(settings_json)
    process = WorkerProcess(settings)  # its own consumer of the group commits, as a task's does
    consumer = clients.consumer(
        settings.kafka,
        {"group.id": settings.group_id, "enable.auto.commit": False, "auto.offset.reset": "earliest"},
    )
    consumer.assign([TopicPartition(topic, p) for p in partitions])  # from the group's committed offsets
    tasks: dict[int, PartitionTask] = {}
    ends: dict[int, int] = {}
    finishing = ThreadPoolExecutor(len(partitions))
    slice_ends = time.monotonic() + SLICE_S
    try:
        while not stop.is_set():
            by_partition: dict[int, list[Record]] = {}
            for m in consumer.consume(BATCH, WAIT_S):
                if m.error() is None:
                    by_partition.setdefault(m.partition(), []).append(
                        Record.make(m.key(), m.value(), (), topic, m.partition(), m.offset(), 1, m.timestamp()[1])
                    )
            for partition, records in by_partition.items():
                task = tasks.get(partition)
                if task is None:
                    task = tasks[partition] = PartitionTask(process, topic, partition)
                task.feed(records)
                ends[partition] = records[-1].offset + 1
            for task in tasks.values():
                task.drain()  # rows go nowhere: the benchmark counts outputs
            if time.monotonic() >= slice_ends:
                # Together: a task commits once the process's producer holds nothing unacknowledged,
                # which never comes while another task's slots still produce.
                list(finishing.map(PartitionTask.finish, tasks.values(), [ends[p] for p in tasks]))
                for task in tasks.values():
                    task.drain()
                tasks, ends = {}, {}
                slice_ends = time.monotonic() + SLICE_S
    finally:
        for task in tasks.values():
            task.abandon()
        consumer.close()
        process.close()


def run(settings_json: str, topic: str, partitions: int, processes: int) -> Callable[[], None]:
    """Start ``processes`` members, the partitions split between them; returns the function that
    stops them and waits."""
    return spawned(member, [(settings_json, topic, list(range(i, partitions, processes))) for i in range(processes)])
