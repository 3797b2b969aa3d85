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

import logging
import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from queueplane.kafka.cluster import refusal
from queueplane.kafka.offsets import commits_reader, fetch_committed
from queueplane.run.consumer.executor.member import MEMBERS, GroupMember, MemberFailed
from queueplane.run.consumer.executor.process import ConsumerSettings, MemberSettings
from queueplane.run.consumer.executor.unreported import SliceId
from queueplane.run.executor.processes import PerProcess
from queueplane.run.outcomes import OUTCOME_SCHEMA, SKIPPED, Outcome, columns_batch, columns_of

log = logging.getLogger("queueplane.worker")

SOURCE_NAME = "queueplane-members"
# Set in the environment of a queue's source: Spark keeps one pool of Python workers per
# environment of the function it runs, so each consumer queue's tasks come back to its members.
QUEUE_ENV = "QUEUEPLANE_CONSUMER_QUEUE"


class SliceTask(InputPartition):
    """One task of a micro-batch (``slice_id``: the same in each attempt of it); ``skipped``: per
    partition, records the group committed that no micro-batch of this checkpoint reported (a
    restart from an older checkpoint), counted once."""

    def __init__(self, slice_id: SliceId, final: bool, skipped: dict[int, tuple[int, int]] | None = None):
        super().__init__(slice_id.index)
        self.slice_id = slice_id
        self.final = final
        self.skipped = skipped or {}


class MemberStreamReader(DataSourceStreamReader):
    """The time slices of one group type's members: ``members`` holds them, one per process."""

    members: PerProcess[GroupMember] = MEMBERS
    settings_type: type[MemberSettings] = ConsumerSettings

    def __init__(self, settings_json: str, tasks: int, drain_file: str, partitions: int):
        self.settings_json = settings_json
        self.tasks = tasks
        self.drain_file = drain_file
        self.partition_count = partitions
        self.batch = 0
        self.run = uuid.uuid4().hex  # this reader's: a slice of another run is never one of ours
        self._planned = False  # whether this query's run planned a batch of its own yet
        self._group: Any = None
        self._restart_base: dict[str, int] | None = None  # the checkpoint's last batch's commits

    def _committed(self) -> dict[str, int]:
        """The group's committed offsets now (a consumer that never subscribes), kept in each
        batch's offsets: a restart from this checkpoint knows what its batches had reported."""
        if not self.partition_count:
            return {}
        settings = self.settings_type.from_json(self.settings_json)
        try:
            if self._group is None:
                self._group = commits_reader(settings.kafka, settings.group_id)
            committed = fetch_committed(self._group, settings.topic, range(self.partition_count))
        except Exception:  # advisory: a batch without it counts nothing as skipped
            return {}
        return {str(p): offset for p, offset in committed.items() if offset is not None}

    def initialOffset(self) -> dict:
        return {"batch": 0, "committed": self._committed()}

    def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
        # Every trigger is a new time slice: there is always a next batch to run.
        self.batch = max(self.batch, (start or {}).get("batch", 0)) + 1
        if not self._planned:
            self._planned = True
            if (start or {}).get("batch", 0) > 0:  # a restart from a checkpoint
                self._restart_base = (start or {}).get("committed")
        return {"batch": self.batch, "committed": self._committed()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        final = bool(self.drain_file) and os.path.exists(self.drain_file)
        skipped: dict[int, tuple[int, int]] = {}
        if not self._planned:
            # A batch this checkpoint logged and never finished, run again: what it reported died
            # with the run, so what the group committed past its plan is counted once, here.
            self._planned = True
            base = end.get("committed")
        else:
            base, self._restart_base = self._restart_base, None
        if base:
            now = self._committed()
            for key, offset in now.items():
                before = base.get(key)
                if before is not None and offset > before:
                    skipped[int(key)] = (before, offset)
        batch = int(end.get("batch", 0))
        return [SliceTask(SliceId(self.run, batch, i), final, skipped if i == 0 else None) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task = cast(SliceTask, partition)  # what partitions() planned
        member = self.members.get(self.settings_json)
        try:
            blocks = member.run_batch(task.slice_id, final=task.final)
        except MemberFailed as exc:
            refused = refusal(exc.__cause__) if exc.__cause__ is not None else None
            if refused is None:
                raise
            # Kafka refused the worker's credentials or ACLs: the driver's backlog reads are
            # refused the same way and end the run with that one line (as a share worker's
            # are), so the task says it once here rather than as a traceback in every retry.
            log.warning("%s", refused)
            return
        if task.final:
            self.members.drained(self.settings_json)  # the spec's processing.teardown
        for p, (first, end) in task.skipped.items():
            skipped = [Outcome(member.topic, p, offset, None, 1, SKIPPED, None, 0.0, 0) for offset in range(first, end)]
            blocks.append(columns_of(skipped))
        if blocks:
            yield columns_batch(blocks)

    def commit(self, end: dict) -> None:
        # Offsets were committed to the group by its members, before their rows came out.
        return None


class MemberSource(DataSource):
    """Options: settings (ConsumerSettings as JSON), tasks (parallel tasks per micro-batch),
    drain_file (while it exists, batches drain their members)."""

    stream_reader_type: type[MemberStreamReader] = MemberStreamReader

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return OUTCOME_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return self.stream_reader_type(
            self.options["settings"],
            int(self.options.get("tasks", "1")),
            self.options.get("drain_file", ""),
            int(self.options.get("partitions", "0")),
        )


def register_source(spark: Any, queue_name: str, base: type[MemberSource] = MemberSource) -> str:
    """Register the source under a name of this queue's, its tasks in a worker pool of the queue's
    own (as share/source.py does), so they keep coming back to the queue's members."""
    name = f"{SOURCE_NAME}-{queue_name}"
    source = type("QueueMemberSource", (base,), {"name": classmethod(lambda cls: name)})
    environment = spark.sparkContext.environment
    environment[QUEUE_ENV] = queue_name
    try:
        spark.dataSource.register(source)
    finally:
        del environment[QUEUE_ENV]
    return name
