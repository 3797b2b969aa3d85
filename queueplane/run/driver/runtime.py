"""The one interface a group type implements on the driver; the driver never asks which type it runs.

A group type's semantics live in its own folder (``share/``, ``consumer/``, ``kmq/``): the code
its executors run, and a ``QueueRuntime`` subclass that tells the driver what the type needs:
Spark settings, how many local task threads, the streaming query of outcome rows, whether a
stop or a scale-down must drain first, and what to do around each micro-batch. Adding a group
type is a new folder and one line in ``group_types.py``.
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from queueplane.kafka.target import KafkaTarget
from queueplane.run.driver.options import DeadLetters, RunOptions
from queueplane.spec.model import QueueSpec


class QueueRuntime(ABC):
    """One queue's group type, as the driver sees it. One instance per run."""

    group_type: ClassVar[str]
    # The last micro-batch before a stop, and before a scale-down, must drain: every process
    # settles and reports what it holds (share groups hold acquired records between batches).
    drains: ClassVar[bool] = False
    # After a scale-down's draining batch, how long until processes that had no task in it have
    # let go too (share: they close their consumers once their lease is long over).
    drain_settle_s: ClassVar[float] = 0.0
    # The source runs no micro-batch while nothing is new (Spark's Kafka source), so the sink
    # never sees the queue idle: the driver looks for a stop condition between batches too.
    batches_only_on_input: ClassVar[bool] = True
    # Spark's shuffle partitions: no runtime shuffles its records.
    shuffle_partitions: ClassVar[int] = 2

    def __init__(self, queue: QueueSpec, target: KafkaTarget, options: RunOptions):
        self.queue, self.target, self.options = queue, target, options
        self.temporary: list[Path] = []  # folders this run made for itself

    @property
    def longest_batch_s(self) -> float | None:
        """How long one micro-batch lasts at most when nothing is wrong (a time-sliced source: its
        slices); None where a batch lasts as long as its records take (Spark's Kafka source). The
        worker counts as stuck once batches stop ending for longer (``health.stopped_seconds``)."""
        return None

    def group_members(self) -> int | None:
        """How many consumers are members of the queue's group now, for a scale-down that waits
        until a drain has emptied it; None where no consumer holds records between batches."""
        return None

    @staticmethod
    def executor_cap(queue: QueueSpec) -> int | None:
        """The most executors that can get work (None: any number); autoscaling stays below it."""
        return None

    def configure(self, builder: Any) -> Any:
        """The SparkSession builder with what this group type needs (jars, state store)."""
        return builder

    def local_threads(self) -> int:
        """Task threads of Spark's local mode (``--tasks`` overrides it)."""
        return self.options.tasks or os.cpu_count() or 2

    def checkpoint(self) -> str:
        """The worker query's checkpoint folder; without ``--checkpoint-dir``, a new temporary one
        (listed in ``temporary``: no later run can resume from it, so the driver removes it at the end)."""
        if self.options.checkpoint_dir:
            return self.options.checkpoint_dir
        folder = tempfile.mkdtemp(prefix=f"queueplane-{self.queue.name}-ckpt-")
        self.temporary.append(Path(folder))
        return folder

    def start(self, spark: Any) -> None:
        """Start what runs beside the worker query (kmq: the redelivery tracker)."""
        return None

    @abstractmethod
    def stream(self, spark: Any, drain_file: Path, executor_ceiling: int | None) -> Any:
        """The streaming DataFrame of outcome rows.

        ``drain_file``: once it exists, the next micro-batch drains (runtimes that ``drains``).
        ``executor_ceiling``: the most executors autoscaling may run, None with a fixed count.
        """

    def after_batch(self, table: Any, ranges: dict[int, int]) -> None:
        """Called with each micro-batch's outcome rows (Arrow), after the metrics took them.

        ``ranges``: where the batch read the queue's topic up to, per partition (``range_ends.py``;
        empty where Spark's source keeps no such log, as for share groups).
        """
        return None

    def idle(self) -> bool:
        """Nothing the runtime holds can still come back (the queue's lag says the rest)."""
        return True

    def requeued_at(self) -> float | None:
        """When (``time.monotonic``) the runtime last wrote records back to the queue's topic
        (kmq's redeliveries), or None. Those are records to come as much as a batch's are: the
        idle time counts from then, and a lag of 0 read before then says nothing of them."""
        return None

    def failed(self) -> BaseException | None:
        """An error of something running beside the worker query, which ends the run."""
        return None

    def degraded(self) -> str | None:
        """Why something running beside the worker query cannot do its work now (Kafka away, which
        it rides out), or None; the worker is not ready while there is a reason."""
        return None

    def stop(self, counts: Counter[str], dead: DeadLetters) -> None:
        """Stop what ``start`` started and add what it did to the run's counts and dead letters."""
        return None
