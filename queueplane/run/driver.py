"""The worker on the driver: starts the streaming query of a queue's runtime and watches it.

`queueplane run` (local mode) and the chart's spark-submit entrypoint both come here. The
driver knows no group type: what differs between them is behind ``QueueRuntime``.
The query's rows are outcomes; a foreachBatch sink on the driver turns them into
counters, Prometheus metrics, one progress line per batch, and the exit summary.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from queueplane.errors import ClusterRefused, QueueplaneError
from queueplane.kafka import clients
from queueplane.kafka.cluster import refusal
from queueplane.kafka.lag import BacklogReader, total_lag
from queueplane.kafka.offsets import await_queue_topics
from queueplane.kafka.target import KafkaTarget
from queueplane.run.group_types import runtime_class
from queueplane.run.health import Health, stall_seconds, starve_seconds
from queueplane.run.metrics import WorkerMetrics
from queueplane.run.options import STARTUP_WAIT_S, BatchProgress, DeadLetters, RunOptions, RunSummary
from queueplane.run.outcomes import ACCEPTED, DEAD_LETTERED, FINAL_OUTCOMES, RELEASED
from queueplane.run.queue_status import (
    DRAINING,
    FAILED,
    RUNNING,
    STARTING,
    STOPPED,
    Observation,
    QueueReads,
    StatusReporter,
)
from queueplane.run.range_ends import batch_range_ends
from queueplane.run.scaling.controller import ExecutorController
from queueplane.run.session import ship_handler_modules, spark_session
from queueplane.run.termination import Termination
from queueplane.spec.model import QueueSpec

log = logging.getLogger("queueplane.worker")
STOP_WAIT_S = 60.0


class WorkerFailed(QueueplaneError):
    """The streaming query stopped with an error."""


class DrainRequests:
    """Why the next micro-batches drain: the drain file exists while any reason is pending.

    Stopping and scaling down both need every process settled and reported before they act;
    each asks under its own reason, so one finishing does not cancel the other's drain.
    """

    def __init__(self, path: Path):
        self.path = path
        self._reasons: set[str] = set()

    def request(self, reason: str) -> None:
        self._reasons.add(reason)
        self.path.touch()

    def release(self, reason: str) -> None:
        self._reasons.discard(reason)
        if not self._reasons:
            self.path.unlink(missing_ok=True)


class BacklogWatcher:
    """Reads the queue's backlog in the background, so no micro-batch waits for a broker round trip.

    Each read also tells the worker's health whether Kafka answers; a failing read is logged
    once when it starts failing and once when it answers again. A read Kafka refuses (the
    worker's credentials, or an ACL it lost) is kept in ``refused``: the worker stops on it.
    """

    INTERVAL_S = 1.0

    def __init__(self, read: Callable[[], dict[int, int | None] | None], health: Health):
        self.read = read
        self.health = health
        self.latest: dict[int, int | None] | None = None
        self._failing = False
        self._failing_since: tuple[float, float] | None = None  # (wall, monotonic) of the first failed read
        self._error = ""
        self.refused: ClusterRefused | None = None
        self.outages: list[dict[str, Any]] = []  # ended ones: when, how long, the first error
        # Since when Kafka answers without a break (monotonic): the worker's start, or the end of an outage.
        self.answering_since = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qp-backlog", daemon=True)

    def start(self) -> None:
        self.read_now()
        self._thread.start()

    @property
    def failing(self) -> bool:
        """The last backlog read failed: Kafka does not answer."""
        return self._failing

    def read_now(self) -> dict[int, int | None] | None:
        # A read against a stopped broker can wait out its timeout before it fails: the outage
        # counts from when the failing read began, not from when it gave up.
        began = (time.time(), time.monotonic())
        try:
            self.latest = self.read()
        except Exception as exc:  # lag is advisory: a failed read must not stop the worker, a refused one does
            self.latest = None
            refused = refusal(exc)
            if refused is not None:
                # Kafka answered, with a refusal: not an outage. The worker is not ready from now
                # on and stops on it (``refused``), with the refusal as its one line.
                if self.refused is None:
                    self.refused = refused
                    self.health.kafka_refused(str(refused))
                    log.error("%s", refused)
                return None
            self.health.kafka_failed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            if not self._failing:
                log.warning("backlog read failed (Kafka does not answer): %s", exc)
                self._failing_since = began
                self._error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._failing = True
        else:
            self.health.kafka_answered(time.monotonic())
            if self._failing:
                self.answering_since = time.monotonic()
                self.outages.append(self._outage(self.answering_since))
                log.info("backlog read: Kafka answers again, after %.0fs", self.outages[-1]["seconds"])
            self._failing = False
        return self.latest

    def _outage(self, now: float) -> dict[str, Any]:
        wall, since = self._failing_since or (time.time(), now)
        began = datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds")
        return {"began": began, "seconds": round(now - since, 1), "error": self._error}

    def all_outages(self) -> list[dict[str, Any]]:
        """The outages seen, with the one still going (if any) up to now."""
        return self.outages + ([self._outage(time.monotonic())] if self._failing else [])

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self.read_now()

    def stop(self) -> None:
        self._stop.set()


def _quietly(read: Callable[[], Any]) -> Any:
    """A status read that may fail (Kafka away): unknown this time, never an error of the worker."""
    try:
        return read()
    except Exception:  # the status is advisory
        return None


def run_queue(
    queue: QueueSpec,
    target: KafkaTarget,
    options: RunOptions,
    on_batch: Callable[[BatchProgress], None] = lambda _p: None,
    backlog: BacklogReader | None = None,
    reads: QueueReads | None = None,
    status_patch: Callable[[dict[str, Any]], None] | None = None,
) -> RunSummary:
    """Run the worker until a stop condition holds; return what it did.

    ``reads``: the queue's oldest wait and DLQ count, for the gauges and the status, read every
    few seconds while the worker runs. ``status_patch``: where the status goes (on Kubernetes,
    the release's Queue resource).
    """
    # A worker on a topic that is not there would idle and look healthy: it fails instead.
    topics = {queue.topic.name: "queue topic", queue.dead_letter.name: "dead-letter topic"}
    if queue.markers is not None:
        topics[queue.markers.name] = "markers topic"
    await_queue_topics(target, queue.source, topics, STARTUP_WAIT_S)
    runtime = runtime_class(queue)(queue, target, options)
    spark = spark_session(runtime)
    if not options.local:  # local executors import it from the spec's folder (PYTHONPATH)
        ship_handler_modules(spark, queue)
    # Runtimes that drain: once it exists, the next micro-batch settles and reports what executors hold.
    drain = DrainRequests(Path(tempfile.mkdtemp(prefix=f"queueplane-{queue.name}-")) / "drain")
    runtime.temporary.append(drain.path.parent)
    controller = ExecutorController(
        spark,
        queue,
        executor_cap=runtime.executor_cap(queue),
        drain=drain if runtime.drains else None,
        **options.scaling,
    )
    health = Health(stall_seconds(queue), starve_s=starve_seconds(queue))
    metrics = WorkerMetrics(queue.name)
    metrics.set_bounds(float(queue.target_lag_seconds), controller.policy.ceiling)
    executors = {"running": 0, "requested": controller.requested}

    def on_executors(running: int, requested: int) -> None:
        metrics.set_executors(running, requested)
        executors.update(running=running, requested=requested)

    controller.on_executors = on_executors
    if options.metrics_port is not None:
        metrics.serve(options.metrics_port, options.metrics_host, health)

    counts: Counter[str] = Counter({ACCEPTED: 0, RELEASED: 0, DEAD_LETTERED: 0})
    dead = DeadLetters()
    # Idleness counts from the first micro-batch: a worker that waited for its broker or for
    # Spark to start has not been idle, whatever the clock says.
    state: dict[str, Any] = {
        "batches": 0,
        "last_activity": None,
        "draining": False,
        "last_error": None,
        "starved": False,
    }
    started = time.monotonic()
    stop_requested, may_return = threading.Event(), threading.Event()
    watcher = BacklogWatcher(backlog or (lambda: None), health)
    clients.report_errors()
    metrics.watch_kafka(clients.ERRORS.counts, lambda: sum(o["seconds"] for o in watcher.all_outages()))
    removed_unread = backlog.removed.total if backlog is not None else (lambda: 0)
    state["removed_unread"] = 0
    termination = Termination()

    checkpoint = runtime.checkpoint()

    def observe(phase: str | None = None, error: str | None = None) -> Observation:
        now = time.monotonic()
        ready = health.ready(now)
        if phase is None:
            stopping = state["draining"] or stop_requested.is_set() or termination.requested.is_set()
            phase = STARTING if not health.started else DRAINING if stopping else RUNNING
        oldest_s = _quietly(reads.oldest_seconds) if reads is not None else None
        pending = _quietly(reads.dead_letters) if reads is not None else None
        metrics.set_queue_reads(oldest_s, pending)
        return Observation(
            at=time.time(),
            phase=phase,
            ready=ready,
            lag=total_lag(watcher.latest),
            oldest_s=oldest_s,
            finished=sum(counts[o] for o in FINAL_OUTCOMES),
            dead_lettered=counts[DEAD_LETTERED],
            dead_letters=pending,
            executors_running=executors["running"],
            executors_requested=executors["requested"],
            max_executors=controller.policy.ceiling,
            target_lag_s=float(queue.target_lag_seconds),
            last_error=error or (None if ready.ok else ready.reason) or state["last_error"],
        )

    watched = reads is not None or status_patch is not None
    reporter = StatusReporter(observe, status_patch or (lambda _status: None)) if watched else None

    def sink(frame: Any, batch_id: int) -> None:
        # Arrow, not Row objects: the driver handles a batch's outcomes column by column, so the
        # time between two micro-batches (when executors idle) stays short.
        table = frame.toArrow()
        outcome_column = table.column("outcome").to_pylist()
        batch_counts = Counter(outcome_column)
        counts.update(batch_counts)
        if batch_counts[DEAD_LETTERED]:
            mask = pc.equal(table.column("outcome"), DEAD_LETTERED)
            for row in table.filter(mask).select(["partition", "offset", "key", "delivery_count", "error"]).to_pylist():
                dead.add(row)
            state["last_error"] = f"partition {row['partition']} offset {row['offset']}: {row['error']}"
        metrics.observe(batch_counts, table)
        runtime.after_batch(table, batch_range_ends(checkpoint, batch_id, queue.topic.name))
        lag = watcher.latest
        total = total_lag(lag)
        metrics.set_backlog(lag)
        removed = removed_unread()
        if removed > state["removed_unread"]:
            log.warning(
                "%d records of %s were removed by retention before the group read them: skipped, not handled",
                removed - state["removed_unread"],
                queue.topic.name,
            )
            state["removed_unread"] = removed
            metrics.set_removed_unread(removed)
        state["batches"] += 1
        now = time.monotonic()
        health.batch_handled(now, total, table.num_rows)
        starved = health.starved(now)
        if starved and not state["starved"]:
            log.error("records wait unhandled: %s", starved)
        elif state["starved"] and not starved:
            log.info("records are handled again")
        state["starved"] = bool(starved)
        if table.num_rows or state["last_activity"] is None:
            state["last_activity"] = time.monotonic()
        elapsed = time.monotonic() - started
        log.info(
            "batch %d: %d accepted, %d released, %d dlq (totals %d/%d/%d), backlog %s, %.0f records/s",
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
        controller.on_batch(sum(batch_counts[o] for o in FINAL_OUTCOMES), lag)
        on_batch(BatchProgress(batch_id, dict(counts), dict(batch_counts), total, elapsed))
        if state["draining"] or (should_stop(lag) and not runtime.drains):
            # A draining runtime: that was the draining batch, every process has settled and reported
            # what it held. Hold the stream thread here, between batches, while the query stops.
            stop_requested.set()
            may_return.wait(STOP_WAIT_S)
        elif should_stop(lag):
            drain.request("stop")  # the next batch drains the executors
            state["draining"] = True

    def should_stop(lag: dict[int, int | None] | None) -> bool:
        if termination.requested.is_set():
            return True
        final = sum(counts[o] for o in FINAL_OUTCOMES)
        if options.max_records is not None and final >= options.max_records:
            return True
        if state["last_activity"] is None:
            return options.max_duration_s is not None and time.monotonic() - started >= options.max_duration_s
        # Idle time counts from the last batch with records, or from the end of an outage if later:
        # right after one the source has not caught up yet and the group's offsets may still be
        # unreadable (a broker's coordinator loads), which is not an empty queue either.
        idle = time.monotonic() - max(state["last_activity"], watcher.answering_since)
        # Drained: the broker says no lag; where this listener cannot tell the lag, idleness alone
        # decides, but never while Kafka does not answer: an outage is not an empty queue.
        drained = ((lag is None and not watcher.failing) or total_lag(lag) == 0) and runtime.idle()
        if options.until_idle_s is not None and idle >= options.until_idle_s and drained:
            return True
        return options.max_duration_s is not None and time.monotonic() - started >= options.max_duration_s

    watcher.start()
    if reporter is not None:
        reporter.start()
    runtime.start(spark)
    ceiling = controller.policy.ceiling if controller.enabled else None
    query = (
        runtime.stream(spark, drain.path, ceiling)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    health.query_started()
    termination.install()
    try:
        last_look = time.monotonic()
        while query.isActive and not stop_requested.is_set():
            try:
                if query.awaitTermination(0.25):
                    break
            except Exception:  # the query failed: query.exception() below says how
                break
            in_batch = bool(query.status["isTriggerActive"])
            health.batch_running(time.monotonic(), in_batch)
            if runtime.failed() or watcher.refused is not None:
                break
            # A source that runs no batch while there is nothing new never lets the sink see the
            # queue idle: look between batches here.
            if runtime.batches_only_on_input and time.monotonic() - last_look >= 1.0:
                last_look = time.monotonic()
                if not in_batch:
                    lag = watcher.latest
                    metrics.set_backlog(lag)
                    if should_stop(lag):
                        stop_requested.set()
        if stop_requested.is_set():
            stopper = threading.Thread(target=query.stop, name="qp-stop")
            stopper.start()
            time.sleep(0.5)
            may_return.set()
            stopper.join()
        error = query.exception() or runtime.failed()
        if error is not None and watcher.refused is None:
            watcher.read_now()  # a query that failed because Kafka refused the worker says so in one line
        if watcher.refused is not None:  # Kafka said no to the worker's principal: not waiting it out
            health.query_stopped(str(watcher.refused))
            if reporter is not None:
                reporter.stop(observe(FAILED, str(watcher.refused)))
            # The micro-batch that stop() cancels fails in its Python callback: expected, not worth a traceback.
            logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
            query.stop()
            raise watcher.refused
        if error is not None:
            first_line = str(error).splitlines()[0]
            health.query_stopped(first_line)
            if reporter is not None:
                reporter.stop(observe(FAILED, first_line))
            raise WorkerFailed(f"the streaming query of {queue.name} failed: {first_line}")
    finally:
        may_return.set()
        if query.isActive:
            query.stop()
        runtime.stop(counts, dead)
        metrics.stop()
        watcher.stop()
        termination.restore()
    if reporter is not None:
        reporter.stop(observe(STOPPED))
    duration = time.monotonic() - started
    lag = watcher.read_now()
    spark.stop()
    for folder in runtime.temporary:
        shutil.rmtree(folder, ignore_errors=True)
    final = sum(counts[o] for o in FINAL_OUTCOMES)
    return RunSummary(
        queue=queue.name,
        group_type=queue.group.type,
        counts=dict(counts),
        dead_lettered=dead.rows,
        dead_lettered_by_delivery_count=dict(sorted(dead.by_delivery_count.items())),
        duration_s=round(duration, 2),
        batches=state["batches"],
        records_per_s=round(final / duration, 1) if duration else 0.0,
        lag_at_exit=total_lag(lag),
        removed_by_retention=state["removed_unread"],
        kafka_outages=watcher.all_outages(),
        kafka_client_errors=clients.ERRORS.counts(),
        lag_by_partition={str(p): n for p, n in (lag or {}).items()},
        scaling=controller.decisions,
    )
