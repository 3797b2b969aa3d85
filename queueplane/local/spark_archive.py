"""A class-data sharing (CDS) archive of Spark's JVM: local Spark drivers start in about half the CPU.

A Spark driver loads some twenty thousand classes from pyspark's jars before its first batch, and
on a small machine that start-up costs more CPU than a short run's records. The JVM can map
classes it parsed and verified once from an archive instead (``-XX:SharedArchiveFile``). The
set-up step writes one by running a small Spark job that touches what a worker touches (SQL, a
Python UDF over Arrow, a streaming query with foreachBatch, the Kafka source) with
``-XX:ArchiveClassesAtExit``.

The archive belongs to one JVM binary and one pyspark installation; its name carries a digest
of both, so another JDK or venv finds none and starts as before. A JVM that cannot use an
archive ignores it (``-Xshare:auto``), and its CDS log lines, which the JVM prints on stdout
where a worker prints its summary, are switched off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from queueplane.errors import LocalStackError
from queueplane.local.processes import wait_gone
from queueplane.paths import cache_dir
from queueplane.run.spark.interpreter import launcher

DUMP_TIMEOUT_S = 600.0
QUIET = "-Xlog:cds*=off"

# Run by the interpreter of this venv with ``-XX:ArchiveClassesAtExit`` in SPARK_SUBMIT_OPTS;
# prints the driver JVM's pid, which writes the archive when it exits after Python does.
_JOB = r"""
import json, sys, tempfile
from pathlib import Path
from pyspark.sql import SparkSession
from queueplane.run.spark.kafka_input import connector_jars
from queueplane.run.spark.session import DAEMON_MODULE

spark = (
    SparkSession.builder.master("local[2]").appName("queueplane-cds")
    .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    .config("spark.python.worker.reuse", "true").config("spark.python.daemon.module", DAEMON_MODULE)
    .config("spark.sql.shuffle.partitions", "2").config("spark.jars", ",".join(connector_jars()))
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
print(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid(), flush=True)

def same(batches):
    yield from batches

spark.range(1000).mapInArrow(same, "id long").selectExpr("id % 7 AS k").groupBy("k").count().collect()
spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "t").load()
work = Path(tempfile.mkdtemp())
(work / "in").mkdir()
(work / "in" / "a.json").write_text("\n".join(json.dumps({"id": i, "v": str(i)}) for i in range(100)))
seen = []
query = (
    spark.readStream.schema("id long, v string").json(str(work / "in"))
    .writeStream.trigger(availableNow=True).option("checkpointLocation", str(work / "checkpoint"))
    .foreachBatch(lambda frame, _: seen.append(frame.mapInArrow(same, "id long, v string").count()))
    .start()
)
query.awaitTermination(300)
spark.stop()
sys.exit(0 if seen and seen[0] == 100 else 1)
"""


def _java() -> Path | None:
    """The java Spark's launcher runs: $JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).is_file() else None


def _spark_jars() -> Path | None:
    """The jars on the driver's class path, which the archive records; None without pyspark."""
    from importlib.util import find_spec

    if find_spec("pyspark") is None:
        return None
    # Imported here: the set-up's early Go builds import this module before pip has run.
    from queueplane.run.spark.kafka_input import pyspark_jars

    return pyspark_jars().resolve()


def archive_path() -> Path | None:
    """Where this JVM and this pyspark's archive belongs; None without a JVM or pyspark."""
    java, jars = _java(), _spark_jars()
    if java is None or jars is None or not jars.is_dir():
        return None
    digest = hashlib.sha256()
    stat = java.stat()
    digest.update(f"{java}\0{stat.st_size}\0{stat.st_mtime_ns}\0{jars}\0".encode())
    # The JVM refuses an archive whose jars changed size or time, as a reinstall at the same path does.
    for jar in sorted(jars.glob("*.jar")):
        jar_stat = jar.stat()
        digest.update(f"{jar.name}\0{jar_stat.st_size}\0{jar_stat.st_mtime_ns}\0".encode())
    return cache_dir() / "spark-cds" / f"spark-{digest.hexdigest()[:16]}.jsa"


def java_options() -> str:
    """JVM options that use the archive when the set-up made one; empty otherwise."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path is not None and path.is_file() else ""


def build_archive() -> str:
    """Write the archive unless this JVM and pyspark have one; returns what is there."""
    path = archive_path()
    if path is None:
        return "no JVM or pyspark here: nothing to archive"
    if path.is_file():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob("spark-*.jsa"):
        stale.unlink()  # about 150 MB each; one JVM and venv at a time
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        partial = Path(scratch) / path.name
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} {QUIET}",
            "PYSPARK_PYTHON": launcher(),  # the Python workers need this venv, as a worker's do
        }
        job = subprocess.run(
            [sys.executable, "-c", _JOB], env=env, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S
        )
        lines = job.stdout.split()
        if job.returncode != 0 or not lines:
            tail = "\n".join((job.stdout + job.stderr).strip().splitlines()[-15:])
            raise LocalStackError(f"the Spark job that records the class-data archive failed:\n{tail}")
        # The JVM outlives the Python that started it by the time it takes to write the archive.
        pid = int(lines[0])
        if not wait_gone(pid, DUMP_TIMEOUT_S):
            raise LocalStackError(f"the Spark driver (pid {pid}) did not exit within {DUMP_TIMEOUT_S:.0f}s")
        if not partial.is_file():
            raise LocalStackError(f"the Spark driver exited without writing its class-data archive ({partial})")
        partial.replace(path)
    return str(path)
