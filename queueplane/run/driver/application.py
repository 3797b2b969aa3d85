"""The worker on the driver: one application runs the streaming queries of one or more queues.

`queueplane run` (local mode) and the chart's spark-submit entrypoint both come here. The
driver knows no group type: what differs between them is behind ``QueueRuntime``, and what
one queue keeps (its query, counts, health, backlog) is its ``QueueRun``. What the queues of
an application share is here: the SparkSession and its executors, one metrics endpoint whose
series carry each queue's name, one readiness over all of them, the executor pool (sized by
the sum of the queues' demands) and the stop signal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from queueplane.errors import UsageError
from queueplane.kafka import clients
from queueplane.kafka.lag import BacklogReader
from queueplane.kafka.target import KafkaTarget
from queueplane.run.driver.health import ApplicationHealth
from queueplane.run.driver.kube_api import InClusterApi
from queueplane.run.driver.metrics import MetricsServer, WorkerMetrics
from queueplane.run.driver.options import BatchProgress, RunOptions, RunSummary
from queueplane.run.driver.queue_run import QueueJob, QueueRun, WorkerFailed, await_topics
from queueplane.run.driver.queue_status import QueueReads
from queueplane.run.driver.scaling.pool import ExecutorPool
from queueplane.run.driver.termination import Termination
from queueplane.run.executor.crash_journal import journal_folder
from queueplane.run.spark.executor_pods import adopt_config_maps, driver_owner
from queueplane.run.spark.planner_daemons import PlannerReaper
from queueplane.run.spark.session import spark_session
from queueplane.spec.model import QueueSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["QueueJob", "WorkerFailed", "run_application", "run_queue"]

log = logging.getLogger("queueplane.worker")
# How often the driver's loop looks for a stop or an ended query: one call to Spark for every
# query of the application, which returns as soon as one ends. Each query's own state takes a
# few more calls, so it is read at most once a ``LOOK_S`` (queue_run.py): read four times a
# second, they were half the driver's Python time in an application of twenty idle queues.
WATCH_S = 0.25


def run_queue(
    queue: QueueSpec,
    target: KafkaTarget,
    options: RunOptions,
    on_batch: Callable[[BatchProgress], None] = lambda _p: None,
    backlog: BacklogReader | None = None,
    reads: QueueReads | None = None,
    status_patch: Callable[[dict[str, Any]], None] | None = None,
) -> RunSummary:
    """Run one queue's worker until a stop condition holds; return what it did."""
    job = QueueJob(queue, on_batch=on_batch, backlog=backlog, reads=reads, status_patch=status_patch)
    return run_application([job], target, options)[0]


def run_application(jobs: list[QueueJob], target: KafkaTarget, options: RunOptions) -> list[RunSummary]:
    """Run several queues in one Spark application until each one's stop condition holds.

    Each queue keeps its own group, semantics, checkpoint, counts and stop condition; a queue
    whose query fails or whose principal Kafka refuses ends alone, and the others run on. The
    first such error is raised once every queue has ended (the others are logged).
    """
    if not jobs:
        raise UsageError("an application needs at least one queue")
    names = [job.queue.name for job in jobs]
    if len(set(names)) != len(names):
        raise UsageError(f"queue names repeat in one application: {', '.join(sorted(names))}")
    for job in jobs:
        await_topics(job.queue, target)
        # Its processes' private folder (crash journal, outboxes), refused here in one line rather
        # than in every task when another user could have written in it.
        journal_folder(job.queue.group.id)
    runs = [QueueRun(job, target, _options_for(job.queue, options, len(jobs))) for job in jobs]
    several = len(runs) > 1
    name = jobs[0].queue.name if not several else f"{jobs[0].queue.name}-and-{len(jobs) - 1}-more"
    spark = spark_session(
        [run.runtime for run in runs],
        app_name=f"queueplane-{name}",
        local=options.local,
        event_log_dir=options.event_log_dir,
        kafka_settings=target.settings,
        checkpoint_dir=options.checkpoint_dir,
    )
    owner = driver_owner()
    if owner is not None and not options.local:
        _adopt_executor_config(spark.sparkContext.applicationId, owner)
    registry, termination, pool = CollectorRegistry(), Termination(), ExecutorPool(spark)
    reaper = PlannerReaper(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()).start()
    clients.report_errors()
    for run in runs:
        run.label = f"{run.queue.name}: " if several else ""
        run.attach(spark, pool, WorkerMetrics(run.queue.name, registry), termination)
    server = None
    if options.metrics_port is not None:
        health = ApplicationHealth({run.queue.name: run.health for run in runs})
        server = MetricsServer(registry, health, options.metrics_port, options.metrics_host)
    errors: list[BaseException] = []
    termination.install()
    try:
        for run in runs:
            run.start()
        running = list(runs)
        while running:
            ended = any_query_ended(spark, WATCH_S)
            for run in list(running):
                if run.watch(ended):
                    running.remove(run)
                    _finish(run, errors)
    finally:
        for run in runs:
            if not run.done:
                _finish(run, errors)
        if server is not None:
            server.stop()
        reaper.stop()
        termination.restore()
    if errors:
        # The process ends on the error: its JVM goes with it, without the seconds a stop takes
        # (a refused worker says so in one line within seconds).
        for error in errors[1:]:
            log.error("%s", error)
        raise errors[0]
    spark.stop()
    summaries = [run.summary() for run in runs]
    for run in runs:
        run.remove_temporary()
    return summaries


def any_query_ended(spark: SparkSession, wait_s: float) -> bool:
    """Whether a streaming query of the application ended, waiting up to ``wait_s`` for one to.

    A query that ended is forgotten here (``resetTerminated``), so the next wait waits again;
    each run then finds its own query's state in its look (``QueueRun.watch``).
    """
    streams = spark.streams
    try:
        # Typed as whole seconds; pyspark passes int(timeout * 1000) ms to the JVM.
        ended = bool(streams.awaitAnyTermination(wait_s))  # type: ignore[arg-type]
    except Exception:  # a query failed: its run's look finds which, and finish() says how
        ended = True
    if ended:
        streams.resetTerminated()
    return ended


def _finish(run: QueueRun, errors: list[BaseException]) -> None:
    """End one queue's run; its error ends the application only once the others have ended too."""
    try:
        run.finish()
    except Exception as exc:  # kept: raised after the other queues end
        errors.append(exc)


def _adopt_executor_config(app_id: str, owner: dict[str, Any]) -> None:
    """The executors' ConfigMap, which Spark made as its context started, owned by this driver pod
    as its executors are (run/spark/executor_pods.py says why Spark does not do it)."""
    api = InClusterApi()
    try:
        adopt_config_maps(api, api.namespace(), app_id, owner)
    except OSError as exc:
        log.warning(
            "the executors' ConfigMap was not given this driver pod as its owner (%s): "
            "it stays if this pod dies before the worker stops",
            exc,
        )


def _options_for(queue: QueueSpec, options: RunOptions, queues: int) -> RunOptions:
    """A queue's options in its application: each of several queues checkpoints in its own folder."""
    if queues == 1 or not options.checkpoint_dir:
        return options
    return replace(options, checkpoint_dir=str(Path(options.checkpoint_dir) / queue.name))
