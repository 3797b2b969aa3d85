"""A Spark streaming source (Python Data Source API) whose micro-batches are time slices of the
consumer group's members.

Each Python worker process of a consumer queue is a member of the queue's group (member.py);
the group, not Spark, keeps the position (committed offsets), so each micro-batch is just "the
next time slice": its tasks renew the lease on their process's member and collect the outcome
rows of what the member committed meanwhile. When the driver wants to stop or to scale down, it
creates the drain file; the next batch's tasks then finish every partition's task, commit and
leave the group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from queueplane.run.consumer.member import MEMBERS
from queueplane.run.outcomes import OUTCOME_SCHEMA, outcome_batch

SOURCE_NAME = "queueplane-members"
# Set in the environment of a queue's source: Spark keeps one pool of Python workers per
# environment of the function it runs, so each consumer queue's tasks come back to its members.
QUEUE_ENV = "QUEUEPLANE_CONSUMER_QUEUE"


class SliceTask(InputPartition):
    def __init__(self, index: int, final: bool):
        super().__init__(index)
        self.index = index
        self.final = final


class MemberStreamReader(DataSourceStreamReader):
    def __init__(self, settings_json: str, tasks: int, drain_file: str):
        self.settings_json = settings_json
        self.tasks = tasks
        self.drain_file = drain_file
        self.batch = 0

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
        # Every trigger is a new time slice: there is always a next batch to run.
        self.batch = max(self.batch, (start or {}).get("batch", 0)) + 1
        return {"batch": self.batch}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        final = bool(self.drain_file) and os.path.exists(self.drain_file)
        return [SliceTask(i, final) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rows = MEMBERS.get(self.settings_json).run_batch(final=partition.final)
        if rows:
            yield outcome_batch(rows)

    def commit(self, end: dict) -> None:
        # Offsets were committed to the group by its members, before their rows came out.
        return None


class MemberSource(DataSource):
    """Options: settings (ConsumerSettings as JSON), tasks (parallel tasks per micro-batch),
    drain_file (while it exists, batches drain their members)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return OUTCOME_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return MemberStreamReader(
            self.options["settings"], int(self.options.get("tasks", "1")), self.options.get("drain_file", "")
        )


def register_source(spark: Any, queue_name: str) -> str:
    """Register the source under a name of this queue's, its tasks in a worker pool of the queue's
    own (as share/source.py does), so they keep coming back to the queue's members."""
    name = f"{SOURCE_NAME}-{queue_name}"
    source = type("QueueMemberSource", (MemberSource,), {"name": classmethod(lambda cls: name)})
    environment = spark.sparkContext.environment
    environment[QUEUE_ENV] = queue_name
    try:
        spark.dataSource.register(source)
    finally:
        del environment[QUEUE_ENV]
    return name
