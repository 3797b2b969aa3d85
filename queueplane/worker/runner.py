"""The worker on the driver: builds the Spark streaming query for a queue and watches it.

`queueplane run` (local mode) and the chart's spark-submit entrypoint both come here.
The query's rows are outcomes; a foreachBatch sink on the driver turns them into
counters, Prometheus metrics, one progress line per batch, and the exit summary.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from queueplane.connection import KafkaTarget
from queueplane.errors import QueueplaneError
from queueplane.lag import total_lag
from queueplane.model import QueueSpec
from queueplane.worker.autoscaler import ExecutorController
from queueplane.worker.kmq_query import KmqQueries
from queueplane.worker.metrics import WorkerMetrics
from queueplane.worker.outcomes import ACCEPTED, DEAD_LETTERED, FINAL_OUTCOMES, RELEASED
from queueplane.worker.settings import common_settings
from queueplane.worker.share_runtime import POLL_ROUNDS, SLICE_MS, ShareSettings

log = logging.getLogger("queueplane.worker")
STOP_WAIT_S = 60.0
RUNTIMES = ("share", "consumer", "kmq")
# Consumer groups: records per micro-batch. Each batch costs Spark a fixed 0.5-1 s (offsets,
# planning, checkpoint writes, Python task start); at 10,000 records that was half the time of a
# trivial handler's batch. Memory does not grow with it: slot queues hold the reader back.
DEFAULT_BATCH_RECORDS = 50_000
SPARK_LOG4J = Path(__file__).with_name("spark-log4j2.properties")
DAEMON_MODULE = "queueplane.worker.spark_daemon"  # forks Python workers with pyspark imported once


@dataclass
class RunOptions:
    local: bool = True
    until_idle_s: float | None = None
    max_records: int | None = None
    max_duration_s: float | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    tasks: int | None = None  # parallel tasks per micro-batch; default: the cores Spark has
    batch_ms: int = SLICE_MS  # share groups: time slice of one micro-batch
    checkpoint_dir: str | None = None
    max_batch_records: int | None = None  # consumer groups: most records per micro-batch (maxOffsetsPerTrigger)
    scaling: dict[str, float] = field(default_factory=dict)  # autoscaling policy overrides (intervals, cooldowns)


@dataclass
class BatchProgress:
    batch_id: int
    counts: dict[str, int]
    batch_counts: dict[str, int]
    backlog: int | None
    elapsed_s: float


@dataclass
class RunSummary:
    queue: str
    group_type: str
    counts: dict[str, int]
    dead_lettered: list[dict[str, Any]]
    duration_s: float
    batches: int
    records_per_s: float
    lag_at_exit: int | None
    lag_by_partition: dict[str, int | None] = field(default_factory=dict)
    scaling: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WorkerFailed(QueueplaneError):
    """The streaming query stopped with an error."""


def share_settings(queue: QueueSpec, target: KafkaTarget, options: RunOptions, tasks: int) -> ShareSettings:
    """``processing.concurrency`` is per executor; its ``tasks`` Python processes split it."""
    slots = max(1, -(-queue.concurrency // max(1, tasks)))
    return ShareSettings(
        **common_settings(queue, target),
        topic=queue.topic.name,
        slots=slots,
        # Enough for POLL_ROUNDS rounds of the process's threads, never more than the partition's lock cap.
        max_poll_records=max(1, min(queue.group.max_in_flight, POLL_ROUNDS * slots)),
        batch_ms=options.batch_ms,
    )


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
    """Reads the queue's backlog in the background, so no micro-batch waits for a broker round trip."""

    INTERVAL_S = 1.0

    def __init__(self, read: Callable[[], dict[int, int | None] | None]):
        self.read = read
        self.latest: dict[int, int | None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qp-backlog", daemon=True)

    def start(self) -> None:
        self.latest = self.read()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            try:
                self.latest = self.read()
            except Exception as exc:  # lag is advisory: a failed read must not stop the worker
                log.warning("backlog read failed: %s", exc)
                self.latest = None

    def stop(self) -> None:
        self._stop.set()


def local_threads(queue: QueueSpec, options: RunOptions) -> int:
    """Task threads of local mode: a consumer group runs one task per partition at once (handlers mostly wait)."""
    if options.tasks:
        return options.tasks
    cores = os.cpu_count() or 2
    if queue.group.type == "consumer":
        return max(cores, queue.topic.partitions)
    # kmq: a task per partition at least (handlers mostly wait), and the tracker's one task beside them.
    return max(cores, queue.topic.partitions) + 1 if queue.group.type == "kmq" else cores


def spark_session(queue: QueueSpec, options: RunOptions) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"queueplane-{queue.name}")
    if queue.group.type in ("consumer", "kmq"):
        from queueplane.worker.spark_packages import with_kafka_connector

        builder = with_kafka_connector(builder)
    if queue.group.type == "kmq":
        from queueplane.worker.kmq_tracker import STATE_STORE_PROVIDER

        builder = builder.config("spark.sql.streaming.stateStore.providerClass", STATE_STORE_PROVIDER)
    if options.local:
        # Executors' Python workers must run this interpreter, with the spec's folder importable.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        spec_dir = str(Path(queue.source).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (spec_dir, os.environ.get("PYTHONPATH")) if p)
        builder = builder.master(f"local[{local_threads(queue, options)}]").config("spark.ui.enabled", "false")
    spark = (
        builder.config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        # kmq: the tracker is the only shuffle; one stateful partition keeps it to one Python worker.
        .config("spark.sql.shuffle.partitions", "1" if queue.group.type == "kmq" else "2")
        .config("spark.driver.extraJavaOptions", f"-Xss16m -Dlog4j2.configurationFile=file:{SPARK_LOG4J}")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def ship_handler_modules(spark: Any, queue: QueueSpec) -> None:
    """Zip the handler's top-level module from the spec's folder, if it is there, for the executors."""
    top = queue.handler.split(":")[0].split(".")[0]
    spec_dir = Path(queue.source).resolve().parent
    candidates = [spec_dir / f"{top}.py", spec_dir / top]
    present = [c for c in candidates if c.exists()]
    if not present:
        return  # on PYTHONPATH or installed in the image
    bundle = Path(tempfile.mkdtemp(prefix="queueplane-handler-")) / f"{top}.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        for path in present:
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*.py"))
            for file in files:
                archive.write(file, file.relative_to(spec_dir))
    spark.sparkContext.addPyFile(str(bundle))


def outcome_stream(
    spark: Any,
    queue: QueueSpec,
    target: KafkaTarget,
    options: RunOptions,
    drain_file: Path,
    controller: ExecutorController,
) -> Any:
    """The streaming DataFrame of outcome rows, from the runtime of the queue's group type.

    ``drain_file`` (share groups): once it exists, the next micro-batch drains the fetchers.
    """
    if queue.group.type == "consumer":
        from queueplane.worker.consumer_query import consumer_stream

        return consumer_stream(spark, queue, target, options.max_batch_records or DEFAULT_BATCH_RECORDS)
    if queue.group.type == "kmq":
        from queueplane.worker.kmq_query import kmq_stream

        tasks = options.tasks or spark.sparkContext.defaultParallelism
        return kmq_stream(spark, queue, target, options.max_batch_records, tasks)
    from queueplane.worker.share_source import SOURCE_NAME, ShareSource

    spark.dataSource.register(ShareSource)
    cores = int(queue.executor.get("cores", 1))
    if controller.enabled:  # tasks for the most executors; with fewer, they run in turns
        tasks = options.tasks or controller.policy.ceiling * cores
        settings = share_settings(queue, target, options, cores)
    else:
        # Local mode stands for one executor of the spec's size, as on Kubernetes: executor.cores
        # tasks (Python processes) share processing.concurrency. One pool fed by every consumer
        # kept 48 slots of a 10 ms handler busier than two pools did (0.95-0.96 of the ideal
        # against 0.90-0.91); a trivial handler gains from a second process on a second core
        # (GIL), which cores: 2 gives. A fixed cluster runs a task per core.
        tasks = options.tasks or (cores if options.local else spark.sparkContext.defaultParallelism)
        settings = share_settings(queue, target, options, tasks)
    return (
        spark.readStream.format(SOURCE_NAME)
        .option("settings", settings.to_json())
        .option("tasks", str(tasks))
        .option("drain_file", str(drain_file))
        .load()
    )


def run_queue(
    queue: QueueSpec,
    target: KafkaTarget,
    options: RunOptions,
    on_batch: Callable[[BatchProgress], None] = lambda _p: None,
    backlog: Callable[[], dict[int, int | None] | None] = lambda: None,
) -> RunSummary:
    """Run the worker until a stop condition holds; return what it did."""
    if queue.group.type not in RUNTIMES:
        raise QueueplaneError(f"{queue.source}: group type {queue.group.type} has no runtime yet")
    spark = spark_session(queue, options)
    if not options.local:  # local executors import it from the spec's folder (PYTHONPATH)
        ship_handler_modules(spark, queue)
    # Share groups: once it exists, the next micro-batch drains the executors' fetchers.
    drain = DrainRequests(Path(tempfile.mkdtemp(prefix=f"queueplane-{queue.name}-")) / "drain")
    controller = ExecutorController(
        spark, queue, drain=drain if queue.group.type == "share" else None, **options.scaling
    )
    metrics = WorkerMetrics(queue.name)
    controller.on_executors = metrics.set_executors
    if options.metrics_port is not None:
        metrics.serve(options.metrics_port, options.metrics_host)

    counts: Counter[str] = Counter({ACCEPTED: 0, RELEASED: 0, DEAD_LETTERED: 0})
    dead: list[dict[str, Any]] = []
    state: dict[str, Any] = {"batches": 0, "last_activity": time.monotonic(), "draining": False}
    started = time.monotonic()
    stop_requested, may_return = threading.Event(), threading.Event()
    checkpoint = options.checkpoint_dir or tempfile.mkdtemp(prefix=f"queueplane-{queue.name}-ckpt-")
    watcher = BacklogWatcher(backlog)
    kmq = KmqQueries(queue, target, options, counts, dead) if queue.group.type == "kmq" else None

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
                dead.append(row)
        metrics.observe(batch_counts, table)
        if kmq is not None:
            kmq.after_batch(table)
        lag = watcher.latest
        total = total_lag(lag)
        metrics.set_backlog(lag)
        state["batches"] += 1
        if table.num_rows:
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
        if state["draining"] or (should_stop(lag) and queue.group.type != "share"):
            # Share groups: that was the draining batch, every fetcher has settled and reported
            # what it held. Hold the stream thread here, between batches, while the query stops.
            stop_requested.set()
            may_return.wait(STOP_WAIT_S)
        elif should_stop(lag):
            drain.request("stop")  # the next batch drains the executors' share fetchers
            state["draining"] = True

    def should_stop(lag: dict[int, int | None] | None) -> bool:
        final = sum(counts[o] for o in FINAL_OUTCOMES)
        if options.max_records is not None and final >= options.max_records:
            return True
        idle = time.monotonic() - state["last_activity"]
        # Drained: the broker says no lag; where lag cannot be read at all, idleness alone decides.
        drained = lag is None or total_lag(lag) == 0
        if kmq is not None:
            drained = drained and kmq.idle()
        if options.until_idle_s is not None and idle >= options.until_idle_s and drained:
            return True
        return options.max_duration_s is not None and time.monotonic() - started >= options.max_duration_s

    watcher.start()
    if kmq is not None:
        checkpoint = kmq.start(spark)
    query = (
        outcome_stream(spark, queue, target, options, drain.path, controller)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        last_look = time.monotonic()
        while query.isActive and not stop_requested.is_set():
            if query.awaitTermination(0.25):
                break
            # Spark's Kafka source runs no batch while there is nothing new, so the sink never
            # sees the queue idle: look between batches here.
            if kmq is not None and kmq.failed():
                break
            if queue.group.type in ("consumer", "kmq") and time.monotonic() - last_look >= 1.0:
                last_look = time.monotonic()
                if not query.status["isTriggerActive"]:
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
        error = query.exception() or (kmq.failed() if kmq is not None else None)
        if error is not None:
            raise WorkerFailed(f"the streaming query of {queue.name} failed: {str(error).splitlines()[0]}")
    finally:
        may_return.set()
        if query.isActive:
            query.stop()
        if kmq is not None:
            kmq.stop()
        metrics.stop()
        watcher.stop()
    duration = time.monotonic() - started
    lag = backlog()
    spark.stop()
    final = sum(counts[o] for o in FINAL_OUTCOMES)
    return RunSummary(
        queue=queue.name,
        group_type=queue.group.type,
        counts=dict(counts),
        dead_lettered=dead,
        duration_s=round(duration, 2),
        batches=state["batches"],
        records_per_s=round(final / duration, 1) if duration else 0.0,
        lag_at_exit=total_lag(lag),
        lag_by_partition={str(p): n for p, n in (lag or {}).items()},
        scaling=controller.decisions,
    )
