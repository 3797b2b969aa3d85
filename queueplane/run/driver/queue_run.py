"""One queue of a worker application on the driver: its runtime, streaming query, health and counts.

The driver (``driver.py``) gives each queue of an application a ``QueueRun`` on one shared
SparkSession and metrics registry. A run knows no group type (that is its ``QueueRuntime``)
and nothing of the other queues: it starts its query in its own scheduler pool, turns the
query's outcome rows into counters, metrics and a progress line per batch, decides when its
queue is done, and stops and sums up on its own.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from queueplane.errors import QueueplaneError
from queueplane.kafka import clients
from queueplane.kafka.lag import BacklogReader, total_lag
from queueplane.kafka.offsets import await_queue_topics
from queueplane.kafka.target import KafkaTarget
from queueplane.run.driver.backlog_watcher import BacklogWatcher, records_waiting
from queueplane.run.driver.group_types import runtime_class
from queueplane.run.driver.health import Health, stall_seconds, starve_seconds
from queueplane.run.driver.metrics import WorkerMetrics
from queueplane.run.driver.options import STARTUP_WAIT_S, BatchProgress, DeadLetters, RunOptions, RunSummary
from queueplane.run.driver.queue_status import (
    DRAINING,
    FAILED,
    RUNNING,
    STARTING,
    STOPPED,
    Observation,
    QueueReads,
    StatusReporter,
)
from queueplane.run.driver.range_ends import batch_range_ends
from queueplane.run.driver.runtime import QueueRuntime
from queueplane.run.driver.scaling.controller import ExecutorController
from queueplane.run.driver.scaling.pool import ExecutorPool
from queueplane.run.driver.termination import Termination
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, FINAL_OUTCOMES, RELEASED, outcome_counts
from queueplane.run.spark.session import ship_handler_modules
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.worker")
STOP_WAIT_S = 60.0
# How often a run reads its query's state (a few calls to Spark's JVM) while nothing ended.
LOOK_S = 1.0


class WorkerFailed(QueueplaneError):
    """The streaming query stopped with an error."""


@dataclass
class QueueJob:
    """A queue to run, with what its caller reads and watches of it.

    ``reads``: the queue's oldest wait and DLQ count, for the gauges and the status, read every
    few seconds while the worker runs. ``status_patch``: where the status goes (on Kubernetes,
    the queue's own Queue resource).
    """

    queue: QueueSpec
    on_batch: Callable[[BatchProgress], None] = lambda _p: None
    backlog: BacklogReader | None = None
    reads: QueueReads | None = None
    status_patch: Callable[[dict[str, Any]], None] | None = None


class DrainRequests:
    """Why the next micro-batches drain: the drain file exists while any reason is pending.

    Stopping and scaling down both need every process settled and reported before they act;
    each asks under its own reason, so one finishing does not cancel the other's drain.
    """

    def __init__(
        self,
        path: Path,
        settle_s: float = 0.0,
        wait_s: float = 0.0,
        members: Callable[[], int | None] = lambda: None,
    ):
        self.path = path
        self.settle_s = settle_s  # how long after the request the processes without a task have let go
        self.wait_s = wait_s  # the longest a scale-down waits for the group's consumers to leave
        self._members = members
        self._reasons: set[str] = set()

    def members(self) -> int | None:
        """Consumers still in the queue's group; None when not known (the broker away)."""
        return _quietly(self._members)

    def request(self, reason: str) -> None:
        self._reasons.add(reason)
        self.path.touch()

    def release(self, reason: str) -> None:
        self._reasons.discard(reason)
        if not self._reasons:
            self.path.unlink(missing_ok=True)


def _quietly(read: Callable[[], Any]) -> Any:
    """A status read that may fail (Kafka away): unknown this time, never an error of the worker."""
    try:
        return read()
    except Exception:  # the status is advisory
        return None


def await_topics(queue: QueueSpec, target: KafkaTarget) -> None:
    """A worker on a topic that is not there would idle and look healthy: it fails instead."""
    topics = {queue.topic.name: "queue topic", queue.dead_letter.name: "dead-letter topic"}
    if queue.markers is not None:
        topics[queue.markers.name] = "markers topic"
    await_queue_topics(target, queue.source, topics, STARTUP_WAIT_S)


class QueueRun:
    """A queue's streaming query and everything the driver keeps about it, from start to summary."""

    def __init__(self, job: QueueJob, target: KafkaTarget, options: RunOptions):
        self.job, self.queue, self.target, self.options = job, job.queue, target, options
        self.runtime: QueueRuntime = runtime_class(job.queue)(job.queue, target, options)
        self.counts: Counter[str] = Counter({ACCEPTED: 0, RELEASED: 0, DEAD_LETTERED: 0})
        self.dead = DeadLetters()
        self.health = Health(
            stall_seconds(job.queue),
            starve_s=starve_seconds(job.queue),
            degraded=self.runtime.degraded,
            longest_batch_s=self.runtime.longest_batch_s,
            name=job.queue.name,
        )
        self.watcher = BacklogWatcher(job.backlog or (lambda: None), self.health)
        # Idleness counts from the first micro-batch: a worker that waited for its broker or for
        # Spark to start has not been idle, whatever the clock says.
        self.batches = 0
        self.last_activity: float | None = None
        self.draining = False
        self.last_error: str | None = None
        self.starved = False
        self.removed_unread = 0
        self.stop_requested, self.may_return = threading.Event(), threading.Event()
        self.started = time.monotonic()
        self.query: Any = None
        self.reporter: StatusReporter | None = None
        self.done = False
        self.label = ""  # before its log lines: the queue's name, where an application runs several

    def attach(self, spark: Any, pool: ExecutorPool, metrics: WorkerMetrics, termination: Termination) -> None:
        """Set up on the application's session and executor pool: drain, autoscaling, metrics and status."""
        queue, options, runtime = self.queue, self.options, self.runtime
        self.spark, self.metrics, self.termination = spark, metrics, termination
        if not options.local:  # local executors import it from the spec's folder (PYTHONPATH)
            ship_handler_modules(spark, queue)
        # Runtimes that drain: once it exists, the next micro-batch settles and reports what executors hold.
        self.drain = DrainRequests(
            Path(tempfile.mkdtemp(prefix=f"queueplane-{queue.name}-")) / "drain",
            runtime.drain_settle_s,
            # A draining process may still be handling its last poll's records: they have the lock's time.
            wait_s=runtime.drain_settle_s + queue.group.lock_duration_ms / 1000,
            members=runtime.group_members,
        )
        runtime.temporary.append(self.drain.path.parent)
        self.controller = ExecutorController(
            pool,
            queue,
            executor_cap=runtime.executor_cap(queue),
            drain=self.drain if runtime.drains else None,
            policy_overrides=options.scaling,
        )
        metrics.set_bounds(float(queue.target_lag_seconds), self.controller.policy.ceiling)
        self.executors = {"running": 0, "requested": self.controller.requested}

        def on_executors(running: int, requested: int) -> None:
            metrics.set_executors(running, requested)
            self.executors.update(running=running, requested=requested)

        self.controller.on_executors = on_executors
        watcher = self.watcher
        metrics.watch_kafka(clients.ERRORS.counts, lambda: sum(o["seconds"] for o in watcher.all_outages()))
        backlog = self.job.backlog
        self.removed_total = backlog.removed.total if backlog is not None else (lambda: 0)
        self.checkpoint = runtime.checkpoint()
        if self.job.reads is not None or self.job.status_patch is not None:
            self.reporter = StatusReporter(self.observe, self.job.status_patch or (lambda _status: None))

    def observe(self, phase: str | None = None, error: str | None = None) -> Observation:
        """The queue's status as its Queue resource and gauges show it."""
        now = time.monotonic()
        ready = self.health.ready(now)
        if phase is None:
            stopping = self.draining or self.stop_requested.is_set() or self.termination.requested.is_set()
            phase = STARTING if not self.health.started else DRAINING if stopping else RUNNING
        reads = self.job.reads
        oldest_s = _quietly(reads.oldest_seconds) if reads is not None else None
        pending = _quietly(reads.dead_letters) if reads is not None else None
        self.metrics.set_queue_reads(oldest_s, pending)
        return Observation(
            at=time.time(),
            phase=phase,
            ready=ready,
            lag=total_lag(self.watcher.latest),
            oldest_s=oldest_s,
            finished=sum(self.counts[o] for o in FINAL_OUTCOMES),
            dead_lettered=self.counts[DEAD_LETTERED],
            dead_letters=pending,
            executors_running=self.executors["running"],
            executors_requested=self.executors["requested"],
            max_executors=self.controller.policy.ceiling,
            target_lag_s=float(self.queue.target_lag_seconds),
            last_error=error or (None if ready.ok else ready.reason) or self.last_error,
        )

    def _sink(self, frame: Any, batch_id: int) -> None:
        # Arrow, not Row objects: the driver handles a batch's outcomes column by column, so the
        # time between two micro-batches (when executors idle) stays short. A row may stand for a
        # run of accepted records (outcomes.py): counts weigh each row by its records.
        queue, counts, metrics = self.queue, self.counts, self.metrics
        table = frame.toArrow()
        batch_counts = outcome_counts(table)
        counts.update(batch_counts)
        if batch_counts[DEAD_LETTERED]:
            mask = pc.equal(table.column("outcome"), DEAD_LETTERED)
            for row in table.filter(mask).select(["partition", "offset", "key", "delivery_count", "error"]).to_pylist():
                self.dead.add(row)
            self.last_error = f"partition {row['partition']} offset {row['offset']}: {row['error']}"
        metrics.observe(batch_counts, table)
        self.runtime.after_batch(table, batch_range_ends(self.checkpoint, batch_id, queue.topic.name))
        lag = self.watcher.latest
        total = total_lag(lag)
        metrics.set_backlog(lag)
        removed = self.removed_total()
        if removed > self.removed_unread:
            log.warning(
                "%d records of %s were removed by retention before the group read them: skipped, not handled",
                removed - self.removed_unread,
                queue.topic.name,
            )
            self.removed_unread = removed
            metrics.set_removed_unread(removed)
        self.batches += 1
        now = time.monotonic()
        self.health.batch_handled(now, total, sum(batch_counts.values()))
        starved = self.health.starved(now)
        if starved and not self.starved:
            log.error("%srecords wait unhandled: %s", self.label, starved)
        elif self.starved and not starved:
            log.info("%srecords are handled again", self.label)
        self.starved = bool(starved)
        if table.num_rows or self.last_activity is None:
            self.last_activity = time.monotonic()
        elapsed = time.monotonic() - self.started
        log.info(
            "%sbatch %d: %d accepted, %d released, %d dlq (totals %d/%d/%d), backlog %s, %.0f records/s",
            self.label,
            batch_id,
            batch_counts[ACCEPTED],
            batch_counts[RELEASED],
            batch_counts[DEAD_LETTERED],
            counts[ACCEPTED],
            counts[RELEASED],
            counts[DEAD_LETTERED],
            "?" if total is None else total,
            sum(counts[o] for o in FINAL_OUTCOMES) / max(elapsed, 1e-6),
        )
        busy_s = (pc.sum(table.column("latency_ms")).as_py() or 0.0) / 1000
        self.controller.on_batch(sum(batch_counts[o] for o in FINAL_OUTCOMES), lag, busy_s)
        self.job.on_batch(BatchProgress(batch_id, dict(counts), dict(batch_counts), total, elapsed))
        if self.draining or (self.should_stop(lag) and not self.runtime.drains):
            # A draining runtime: that was the draining batch, every process has settled and reported
            # what it held. Hold the stream thread here, between batches, while the query stops.
            self.stop_requested.set()
            self.may_return.wait(STOP_WAIT_S)
        elif self.should_stop(lag):
            self.drain.request("stop")  # the next batch drains the executors
            self.draining = True

    def should_stop(self, lag: dict[int, int | None] | None) -> bool:
        options = self.options
        if self.termination.requested.is_set():
            return True
        final = sum(self.counts[o] for o in FINAL_OUTCOMES)
        if options.max_records is not None and final >= options.max_records:
            return True
        if self.last_activity is None:
            return options.max_duration_s is not None and time.monotonic() - self.started >= options.max_duration_s
        # Idle time counts from the last batch with records or records put back on the topic (kmq's
        # redeliveries), or from the end of an outage if later:
        # right after one the source has not caught up yet and the group's offsets may still be
        # unreadable (a broker's coordinator loads), which is not an empty queue either.
        active = max(self.last_activity, self.runtime.requeued_at() or 0.0)
        idle = time.monotonic() - max(active, self.watcher.answering_since)
        # Caught up: the broker says no lag; where this listener cannot tell the lag, idleness alone
        # decides, but never while Kafka does not answer: an outage is not an empty queue.
        # A lag of 0 counts only from a read that began after the last records came out, and
        # while no read hangs: through a stalled connection no records come out and the read
        # hangs, leaving an old answer standing while records keep arriving.
        fresh = lag is None or self.watcher.current(active, time.monotonic())
        caught_up = (
            (lag is None and not self.watcher.failing) or (total_lag(lag) == 0 and fresh)
        ) and self.runtime.idle()
        if options.until_idle_s is not None and idle >= options.until_idle_s and caught_up:
            return True
        return options.max_duration_s is not None and time.monotonic() - self.started >= options.max_duration_s

    def start(self) -> None:
        """Start the queue's query (and what its runtime runs beside it) in the queue's scheduler pool."""
        spark, runtime = self.spark, self.runtime
        self.watcher.start()
        if self.reporter is not None:
            self.reporter.start()
        # Queries inherit the local properties of the thread that starts them: each queue's jobs run
        # in its own FAIR pool, so a busy queue cannot hold every core while another's records wait.
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.queue.name)
        runtime.start(spark)
        ceiling = self.controller.policy.ceiling if self.controller.enabled else None
        self.query = (
            runtime.stream(spark, self.drain.path, ceiling)
            .writeStream.foreachBatch(self._sink)
            .option("checkpointLocation", self.checkpoint)
            .trigger(processingTime="0 seconds")
            .start()
        )
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)
        self.health.query_started()
        self._looked_at = time.monotonic()

    def watch(self, ended: bool) -> bool:
        """True once the run is over. Its query's state is read at most once a ``LOOK_S``, and
        at once when ``ended`` (some query of the application ended since the last look)."""
        if self.done or self.stop_requested.is_set():
            return True
        now = time.monotonic()
        if not ended and now - self._looked_at < LOOK_S:
            return False
        self._looked_at = now
        query, runtime = self.query, self.runtime
        if not query.isActive:  # it ended: query.exception() in finish() says how
            return True
        in_batch = bool(query.status["isTriggerActive"])
        self.health.batch_running(now, in_batch)
        self.controller.on_waiting(records_waiting(self.watcher.latest))
        if runtime.failed() or self.watcher.refused is not None:
            return True
        # A source that runs no batch while there is nothing new never lets the sink see the
        # queue idle: look between batches here.
        if runtime.batches_only_on_input and not in_batch:
            lag = self.watcher.latest
            self.metrics.set_backlog(lag)
            if self.should_stop(lag):
                self.stop_requested.set()
        return self.stop_requested.is_set()

    def finish(self) -> None:
        """Stop the query and what runs beside it; raise what ended it, if that was an error.

        Runs once the run is over (``watch`` said so) or the application stops.
        """
        self.done = True
        query, watcher, health, reporter = self.query, self.watcher, self.health, self.reporter
        if query is None:  # another queue of the application failed to start before this one started
            self.runtime.stop(self.counts, self.dead)
            watcher.stop()
            self.duration = time.monotonic() - self.started
            return
        try:
            if self.stop_requested.is_set():
                stopper = threading.Thread(target=query.stop, name="qp-stop")
                stopper.start()
                time.sleep(0.5)
                self.may_return.set()
                stopper.join()
            error = query.exception() or self.runtime.failed()
            if error is not None and watcher.refused is None:
                watcher.read_now()  # a query that failed because Kafka refused the worker says so in one line
            if watcher.refused is not None:  # Kafka said no to the worker's principal: not waiting it out
                health.query_stopped(str(watcher.refused))
                if reporter is not None:
                    reporter.stop(self.observe(FAILED, str(watcher.refused)))
                # The micro-batch that stop() cancels fails in its Python callback: expected, not worth a traceback.
                logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
                query.stop()
                raise watcher.refused
            if error is not None:
                first_line = str(error).splitlines()[0]
                health.query_stopped(first_line)
                if reporter is not None:
                    reporter.stop(self.observe(FAILED, first_line))
                raise WorkerFailed(f"the streaming query of {self.queue.name} failed: {first_line}")
        finally:
            self.may_return.set()
            if query.isActive:
                query.stop()
            self.runtime.stop(self.counts, self.dead)
            watcher.stop()
            self.duration = time.monotonic() - self.started
        if reporter is not None:
            reporter.stop(self.observe(STOPPED))

    def remove_temporary(self) -> None:
        """The folders the run made for itself (no later run can resume from them)."""
        for folder in self.runtime.temporary:
            shutil.rmtree(folder, ignore_errors=True)

    def summary(self) -> RunSummary:
        """What the run did; after ``finish``, once the session stopped (the last lag read is now)."""
        lag = self.watcher.read_now()
        duration = self.duration
        final = sum(self.counts[o] for o in FINAL_OUTCOMES)
        return RunSummary(
            queue=self.queue.name,
            group_type=self.queue.group.type,
            counts=dict(self.counts),
            dead_lettered=self.dead.rows,
            dead_lettered_by_delivery_count=dict(sorted(self.dead.by_delivery_count.items())),
            duration_s=round(duration, 2),
            batches=self.batches,
            records_per_s=round(final / duration, 1) if duration else 0.0,
            lag_at_exit=total_lag(lag),
            removed_by_retention=self.removed_unread,
            kafka_outages=self.watcher.all_outages(),
            kafka_client_errors=clients.ERRORS.counts(),
            lag_by_partition={str(p): n for p, n in (lag or {}).items()},
            scaling=self.controller.decisions,
        )
