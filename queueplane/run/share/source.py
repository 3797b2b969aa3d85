"""A Spark streaming source (Python Data Source API) that runs share-group slots.

Spark has no share-group source. This one has no offsets to track: the share-partition
state lives on the broker, so each micro-batch is just "the next time slice", and its
tasks renew the lease on their process's long-lived fetchers for that slice (see
process.py). When the driver wants to stop or to scale down, it creates the drain file;
the next batch's tasks then drain their processes. The driver stops the query after that batch, or kills
the executors it scales away (a killed process takes its unreported outcomes with it).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from queueplane.run.outcomes import OUTCOME_SCHEMA, columns_batch
from queueplane.run.share.executor.process import PROCESSES

SOURCE_NAME = "queueplane-share"
# Set in the environment of a queue's source: Spark keeps one pool of Python workers per
# environment of the function it runs, so each share queue's tasks have processes of their own.
QUEUE_ENV = "QUEUEPLANE_SHARE_QUEUE"


class SlotTask(InputPartition):
    """One task of a micro-batch: its slot, the batch and the stream (the query) it belongs to,
    which name it in its process's outbox (outbox.py) so that a retry of it is told from a task that
    ended."""

    def __init__(self, index: int, final: bool, stream: str = "", batch: int = 0):
        super().__init__(index)
        self.index = index
        self.final = final
        self.stream = stream
        self.batch = batch


class ShareStreamReader(DataSourceStreamReader):
    def __init__(self, settings_json: str, tasks: int, drain_file: str):
        self.settings_json = settings_json
        self.tasks = tasks
        self.drain_file = drain_file
        self.batch = 0
        # Names the query in the offsets, so its checkpoint keeps it across a restart; a new query
        # (a new checkpoint) counts its batches from one again under another name (outbox.py).
        self.stream = uuid.uuid4().hex

    def initialOffset(self) -> dict:
        return {"batch": 0, "stream": self.stream}

    def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
        # Every trigger is a new time slice: there is always a next batch to run.
        start = start or {}
        self.batch = max(self.batch, start.get("batch", 0)) + 1
        return {"batch": self.batch, "stream": start.get("stream") or self.stream}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        # Planned on the driver's side, so a file is how the driver's decision reaches it.
        final = bool(self.drain_file) and os.path.exists(self.drain_file)
        stream = end.get("stream") or self.stream
        return [SlotTask(i, final, stream, end["batch"]) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlotTask)  # what partitions() planned
        process = PROCESSES.get(self.settings_json)
        task = (partition.stream, partition.batch, partition.index)
        blocks = process.run_batch(final=partition.final, task=task)
        if partition.final:
            PROCESSES.drained(self.settings_json)  # the spec's processing.teardown
        if blocks:
            yield columns_batch(blocks)

    def commit(self, end: dict) -> None:
        # Acknowledgements were committed to the broker inside the tasks, before they returned.
        return None


class ShareSource(DataSource):
    """Options: settings (ShareSettings as JSON), tasks (parallel tasks per micro-batch),
    drain_file (while it exists, batches drain their processes)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return OUTCOME_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return ShareStreamReader(
            self.options["settings"], int(self.options.get("tasks", "1")), self.options.get("drain_file", "")
        )


def register_source(spark: Any, queue_name: str) -> str:
    """Register the source under a name of this queue's; return the name.

    A process's fetchers hold acquired records and settled outcomes between micro-batches, and
    only the queue's next task in that process collects them, so a queue's tasks must keep
    coming back to its processes. Alone in an application they do; beside other queues, Spark
    would hand a task to any idle Python worker. Registered with the queue's name in its
    environment, the source's tasks run in a worker pool of the queue's own.
    """
    name = f"{SOURCE_NAME}-{queue_name}"
    source = type("QueueShareSource", (ShareSource,), {"name": classmethod(lambda cls: name)})
    environment = spark.sparkContext.environment
    environment[QUEUE_ENV] = queue_name
    try:
        spark.dataSource.register(source)
    finally:
        del environment[QUEUE_ENV]
    return name
