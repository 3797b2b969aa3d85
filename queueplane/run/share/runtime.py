"""Share groups (KIP-932) on the driver: queueplane's own Spark source, drained before a stop or a scale-down.

Spark has no share-group source; ``source.py`` is one (Python Data Source API) whose
micro-batches are time slices of the executors' long-lived fetchers (``process.py``). The
broker keeps the share-partition state, so there are no offsets to checkpoint and no
connector jars to fetch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

from queueplane.kafka.protocol import describe_share_group
from queueplane.run.driver.runtime import QueueRuntime
from queueplane.run.settings import QueueSettings
from queueplane.run.share.settings import DRAIN_SETTLE_S, IDLE_SLICE_MS, POLL_ROUNDS, SLICE_MS, ShareSettings


class ShareRuntime(QueueRuntime):
    group_type: ClassVar[str] = "share"
    drains: ClassVar[bool] = True
    drain_settle_s: ClassVar[float] = DRAIN_SETTLE_S
    batches_only_on_input: ClassVar[bool] = False  # every trigger is a new time slice

    def settings(self, tasks: int) -> ShareSettings:
        """``processing.concurrency`` is per executor; its ``tasks`` Python processes split it."""
        queue = self.queue
        slots = max(1, -(-queue.concurrency // max(1, tasks)))
        return ShareSettings(
            **QueueSettings.common(queue, self.target),
            topic=queue.topic.name,
            broker_delivery_limit=queue.group.broker_delivery_limit,
            slots=slots,
            # Enough for POLL_ROUNDS rounds of the process's threads, never more than the partition's lock cap.
            max_poll_records=max(1, min(queue.group.max_in_flight, POLL_ROUNDS * slots)),
            batch_ms=self.options.batch_ms or SLICE_MS,
        )

    @property
    def longest_batch_s(self) -> float | None:
        """Each task holds its process's lease one slice, the idle slice at most; tasks beyond the
        cores run in turns: locally the spec's executor cores share the task threads, on
        executors the tasks are sized for the most and the fewest may run."""
        queue, options = self.queue, self.options
        slice_s = max(options.batch_ms or SLICE_MS, IDLE_SLICE_MS) / 1000
        cores = max(1, int(queue.executor.get("cores", 1)))
        if options.local:
            return slice_s * math.ceil((options.tasks or cores) / self.local_threads())
        tasks = options.tasks or queue.max_executors * cores
        return slice_s * math.ceil(tasks / (max(1, queue.min_executors) * cores))

    def group_members(self) -> int | None:
        """Members of the share group (ShareGroupDescribe): none once a drain has closed every fetcher."""
        group = describe_share_group(self.target.settings, self.queue.group.id, self.queue.topic.name)
        return len(group.members)

    def stream(self, spark: Any, drain_file: Path, executor_ceiling: int | None) -> Any:
        from queueplane.run.share.source import register_source

        source = register_source(spark, self.queue.name)
        cores = int(self.queue.executor.get("cores", 1))
        options = self.options
        if executor_ceiling is not None:  # tasks for the most executors; with fewer, they run in turns
            tasks = options.tasks or executor_ceiling * cores
            settings = self.settings(cores)
        else:
            # Local mode stands for one executor of the spec's size, as on Kubernetes: executor.cores
            # tasks (Python processes) share processing.concurrency (docs/runtimes.md has the figures
            # behind this choice). A fixed cluster runs a task per core.
            tasks = options.tasks or (cores if options.local else spark.sparkContext.defaultParallelism)
            settings = self.settings(tasks)
        return (
            spark.readStream.format(source)
            .option("settings", settings.to_json())
            .option("tasks", str(tasks))
            .option("drain_file", str(drain_file))
            .load()
        )
