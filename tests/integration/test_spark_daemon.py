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
