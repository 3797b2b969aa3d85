"""The Spark session of a worker: what every group type shares, then what its runtime adds."""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from queueplane.kafka import oauth
from queueplane.run.spark.executor_pods import TEMPLATE_ENV, driver_owner, owned_template
from queueplane.run.spark.interpreter import launcher
from queueplane.spec.model import QueueSpec

SPARK_LOG4J = Path(__file__).with_name("spark-log4j2.properties")
DAEMON_MODULE = "queueplane.run.spark.daemon"  # forks Python workers with pyspark imported once
POLLING_DELAY = "100ms"
# Jobs, stages and SQL executions Spark's status store keeps (each 1000 by default, UI or not).
# A worker reads its progress from its own sink, never from the store, yet at a micro-batch a
# second the defaults hold some twenty minutes of history in the driver's heap, which goes on
# filling long after the soak's warm-up. A few minutes' worth is kept.
RETAINED_IN_STATUS_STORE = "100"
EXECUTOR_PREFIX_MAX = 47  # Spark refuses a longer executor pod name prefix (a pod name is at most 63)


class SessionPart(Protocol):
    """What the session asks of each queue's runtime (the driver's QueueRuntime is one): Spark
    set-up stays below the driver, which hands it its runtimes."""

    @property
    def queue(self) -> QueueSpec: ...

    @property
    def shuffle_partitions(self) -> int: ...

    def configure(self, builder: Any) -> Any: ...

    def local_threads(self) -> int: ...


def spark_session(
    runtimes: Sequence[SessionPart],
    app_name: str,
    *,
    local: bool,
    event_log_dir: str | None,
    kafka_settings: dict[str, Any],
    checkpoint_dir: str | None = None,
) -> Any:
    """The session of an application's queues: each runtime adds what its group type needs.

    Settings that are one per application take what the most demanding queue needs (task
    attempts, the local heap), the sum (local task threads: each queue's tasks are its own, and
    a thread costs nothing while its queue is idle), or the least (shuffle partitions: only kmq's
    tracker shuffles, into one stateful partition). With several queues, each query runs in its
    own FAIR scheduler pool.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for runtime in runtimes:
        builder = runtime.configure(builder)
    queues = [runtime.queue for runtime in runtimes]
    attempts = max(task_attempts(queue) for queue in queues)
    if local:
        # Executors' Python workers must run this interpreter, with the specs' folders importable.
        os.environ["PYSPARK_PYTHON"] = launcher()
        spec_dirs = dict.fromkeys(str(Path(queue.source).resolve().parent) for queue in queues)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (*spec_dirs, os.environ.get("PYTHONPATH")) if p)
        master = f"local[{sum(runtime.local_threads() for runtime in runtimes)},{attempts}]"
        builder = builder.master(master).config("spark.ui.enabled", "false")
        # One JVM is driver and executor here: the heap both get on Kubernetes, not the JVM's
        # default of a quarter of the machine, which a long run fills with garbage before collecting.
        heap_mi = max(queue.memory_mi("driver") + queue.memory_mi("executor") for queue in queues)
        builder = builder.config("spark.driver.memory", f"{heap_mi}m")
    elif os.environ.get("POD_NAME"):  # the chart's driver pod
        builder = builder.config("spark.kubernetes.executor.podNamePrefix", executor_prefix(queues[0].name))
        owner, template = driver_owner(), os.environ.get(TEMPLATE_ENV)
        if owner is not None and template:  # executors owned by this pod (executor_pods.py says why)
            folder = Path(tempfile.mkdtemp(prefix="queueplane-executor-"))
            owned = owned_template(Path(template), owner, folder)
            builder = builder.config("spark.kubernetes.executor.podTemplateFile", str(owned))
    if len(runtimes) > 1:
        builder = builder.config("spark.scheduler.mode", "FAIR")
    if event_log_dir:
        builder = with_event_logs(builder, event_log_dir)
    if is_local_path(checkpoint_dir):
        builder = with_local_checkpoints(builder)
    kafka_properties = kafka_system_properties(kafka_settings)
    if kafka_properties:  # executors start after this: their JVMs take the properties as options
        options_text = " ".join(f"-D{key}={value}" for key, value in kafka_properties.items())
        builder = builder.config("spark.executor.extraJavaOptions", options_text)
    spark = (
        builder.config("spark.task.maxFailures", str(attempts))
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .config("spark.sql.shuffle.partitions", str(min(runtime.shuffle_partitions for runtime in runtimes)))
        .config("spark.driver.extraJavaOptions", f"-Xss16m -Dlog4j2.configurationFile=file:{SPARK_LOG4J}")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.retainedJobs", RETAINED_IN_STATUS_STORE)
        .config("spark.ui.retainedStages", RETAINED_IN_STATUS_STORE)
        .config("spark.sql.ui.retainedExecutions", RETAINED_IN_STATUS_STORE)
        # Between empty triggers an idle query asks the broker for its latest offsets; every 10 ms
        # (Spark's default) that was half of an idle consumer queue's CPU (docs/benchmarks.md).
        # A record arriving at an idle queue waits up to this much longer for its batch.
        .config("spark.sql.streaming.pollingDelay", POLLING_DELAY)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # The driver's JVM may already run (spark-submit starts it before this code): set them there.
    if kafka_properties:
        jvm = spark.sparkContext._jvm
        if jvm is None:  # the gateway getOrCreate started or joined is there until the context stops
            raise RuntimeError("the Spark session has no JVM gateway: its context was stopped")
        for key, value in kafka_properties.items():
            jvm.java.lang.System.setProperty(key, value)
    return spark


def kafka_system_properties(settings: dict[str, Any]) -> dict[str, str]:
    """JVM system properties Kafka's Java client needs for these settings: the OAuth token endpoint
    it may contact (Kafka's clients refuse any URL the JVM does not allow)."""
    urls = oauth.allowed_urls(settings)
    return {oauth.ALLOWED_URLS_PROPERTY: urls} if urls else {}


# Records that kill their process, in one task, that the task's attempts must outlast.
KILLERS_PER_TASK = 4


def task_attempts(queue: QueueSpec) -> int:
    """Attempts per task: a handler that kills its Python worker (os._exit, its memory limit, the OOM
    killer) costs the task an attempt each time, and its record goes to the DLQ on the attempt
    after its last delivery (queueplane.run.executor.crash_journal), so that attempt must come before the
    query fails, for each of up to KILLERS_PER_TASK such records in one task (a micro-batch holds
    many records: two killers in one batch were measured to need six attempts at deliveryLimit 3).
    Never fewer than Spark's default of four."""
    return max(4, queue.group.delivery_limit * KILLERS_PER_TASK + 1)


# Spark's checkpoint manager for local folders goes through Hadoop's FileContext, which asks
# whether each file it renames is a symbolic link by running `readlink` (without Hadoop's native
# library, which no package ships); and Hadoop's checksummed local file system writes a .crc
# beside each file and sets each new file's mode by running `chmod`. A micro-batch writes two
# checkpoint files, and 20 idle queues made the JVM start about 25 processes a second.
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
LOCAL_FILE_SYSTEM = "org.apache.hadoop.fs.RawLocalFileSystem"


def is_local_path(folder: str | None) -> bool:
    """Whether checkpoints go to this machine's (or pod's) own disk: no folder given (a
    temporary one), a plain path, or a ``file:`` URI."""
    return folder is None or urlparse(folder).scheme in ("", "file")


def with_local_checkpoints(builder: Any) -> Any:
    """Checkpoints written with Java's own file calls: a rename is one system call (atomic on a
    local disk, as the metadata logs need), with no process started and no checksum file."""
    return builder.config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER).config(
        "spark.hadoop.fs.file.impl", LOCAL_FILE_SYSTEM
    )


# A streaming worker runs for weeks: its event log rolls over in files of this size, which a
# history server compacts, instead of one file that only grows.
EVENT_LOG_FILE_SIZE = "128m"


def with_event_logs(builder: Any, directory: str) -> Any:
    """Spark event logs to ``directory`` (a local path is created: Spark refuses a missing one)."""
    if "://" not in directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        directory = Path(directory).resolve().as_uri()
    return (
        builder.config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", directory)
        .config("spark.eventLog.rolling.enabled", "true")
        .config("spark.eventLog.rolling.maxFileSize", EVENT_LOG_FILE_SIZE)
    )


def executor_prefix(queue_name: str) -> str:
    """Executor pod names of this driver: the queue's name and the driver pod's random suffix.

    During a rolling update two drivers of a queue run side by side, and Spark numbers each
    one's executors from 1: a prefix per driver keeps their pod names apart.
    """
    suffix = os.environ["POD_NAME"].rsplit("-", 1)[-1]
    return f"{queue_name[: EXECUTOR_PREFIX_MAX - len(suffix) - 1].rstrip('-')}-{suffix}"


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
