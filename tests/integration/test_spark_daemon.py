"""Spark's Python workers run pyspark from the installed package: forked from queueplane's daemon,
or started on their own (a stateful query's schema check), through queueplane's launcher."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from helpers import close_spark_gateway

from queueplane.run.spark.interpreter import launcher
from queueplane.run.spark.session import DAEMON_MODULE


@pytest.fixture(scope="module", autouse=True)
def _gateway_closed_after() -> Iterator[None]:
    yield
    close_spark_gateway()


@pytest.mark.parametrize("use_daemon", [True, False], ids=["forked", "started-alone"])
def test_python_workers_import_the_installed_pyspark(use_daemon, monkeypatch):
    from pyspark.sql import SparkSession

    def worker_view(_rows):  # runs in a Spark Python worker (a nested function travels by value)
        import os
        import sys

        import pyspark

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            parent = b" ".join(handle.read().split(b"\0")).decode()
        spark_archive = ("pyspark.zip", ".jar")
        archives = [p for p in sys.path if p.endswith(spark_archive) or os.path.basename(p).startswith("py4j-")]
        yield (pyspark.__file__, ";".join(archives), parent)

    monkeypatch.setitem(os.environ, "PYSPARK_PYTHON", launcher())
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("daemon-test")
        .config("spark.ui.enabled", "false")
        .config("spark.python.use.daemon", str(use_daemon).lower())
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .getOrCreate()
    )
    try:
        seen = spark.sparkContext.parallelize(range(4), 2).mapPartitions(worker_view).collect()
    finally:
        spark.stop()
    import pyspark

    assert len(seen) == 2
    for pyspark_file, archives, parent in seen:
        assert pyspark_file == pyspark.__file__, "workers import the installed package, not Spark's zip"
        assert archives == "", "Spark's zips and jar are off the workers' path"
        assert (f"-m {DAEMON_MODULE}" in parent) == use_daemon, "forked by queueplane's daemon, or by nothing of Python"


def test_a_forked_worker_keeps_what_it_holds_out_of_a_full_collection_after_each_task(monkeypatch):
    """pyspark's daemon collects fully after every task; a queue's worker holds its records in
    flight from one task to the next, so queueplane's daemon does so once a minute at most."""
    from pyspark.sql import SparkSession

    def watch(batches):  # the first task: from now on, only the daemon's own collections run
        import builtins
        import gc
        import os

        import pyarrow as pa

        gc.disable()
        seen: list[int] = []
        gc.callbacks.append(lambda phase, info: seen.append(info["generation"]) if phase == "start" else None)
        vars(builtins)["queueplane_test_collections"] = seen
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "generations": [[]]})

    def report(batches):  # a later task in the same worker: what was collected since
        import builtins
        import os

        import pyarrow as pa

        for _ in batches:
            pass
        seen = list(vars(builtins).get("queueplane_test_collections", ()))
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "generations": [seen]})

    monkeypatch.setitem(os.environ, "PYSPARK_PYTHON", launcher())
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("daemon-collections-test")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .getOrCreate()
    )
    schema = "pid long, generations array<long>"
    try:
        (first,) = spark.range(1, numPartitions=1).mapInArrow(watch, schema).collect()
        (second,) = spark.range(1, numPartitions=1).mapInArrow(report, schema).collect()
    finally:
        spark.stop()
    assert second.pid == first.pid, "both tasks ran in one reused worker"
    assert 2 not in second.generations, f"no full collection between the tasks: {second.generations}"
