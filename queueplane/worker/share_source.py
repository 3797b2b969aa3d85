"""A Spark streaming source (Python Data Source API) that runs share-group slots.

Spark has no share-group source. This one has no offsets to track: the share-partition
state lives on the broker, so each micro-batch is just "the next time slice", and its
tasks lend their process's long-lived slots that slice (see share_runtime).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from queueplane.worker.outcomes import OUTCOME_SCHEMA
from queueplane.worker.share_runtime import ShareSettings, runtime_for

SOURCE_NAME = "queueplane-share"


class SlotTask(InputPartition):
    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


class ShareStreamReader(DataSourceStreamReader):
    def __init__(self, settings_json: str, tasks: int):
        self.settings_json = settings_json
        self.tasks = tasks
        self.batch = 0

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
        # Every trigger is a new time slice: there is always a next batch to run.
        self.batch = max(self.batch, (start or {}).get("batch", 0)) + 1
        return {"batch": self.batch}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [SlotTask(i) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        runtime = runtime_for(ShareSettings.from_json(self.settings_json))
        for outcome in runtime.run_batch():
            yield outcome.row()

    def commit(self, end: dict) -> None:
        # Acknowledgements were committed to the broker inside the tasks, before they returned.
        return None


class ShareSource(DataSource):
    """Options: settings (ShareSettings as JSON), tasks (parallel tasks per micro-batch)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return OUTCOME_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return ShareStreamReader(self.options["settings"], int(self.options.get("tasks", "1")))
