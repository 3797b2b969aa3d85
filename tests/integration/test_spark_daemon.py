"""Spark forks its Python workers from queueplane's daemon, and they run pyspark from the package."""

from __future__ import annotations

import os
import sys

from queueplane.run.session import DAEMON_MODULE


def test_python_workers_fork_from_the_daemon_and_import_the_installed_pyspark():
    from pyspark.sql import SparkSession

    def worker_view(_rows):  # runs in a Spark Python worker (a nested function travels by value)
        import os
        import sys

        import pyspark

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            parent = b" ".join(handle.read().split(b"\0")).decode()
        zips = [p for p in sys.path if p.endswith("pyspark.zip") or os.path.basename(p).startswith("py4j-")]
        yield (pyspark.__file__, ";".join(zips), parent)

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("daemon-test")
        .config("spark.ui.enabled", "false")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .getOrCreate()
    )
    try:
        seen = spark.sparkContext.parallelize(range(4), 2).mapPartitions(worker_view).collect()
    finally:
        spark.stop()
    import pyspark

    assert len(seen) == 2
    for pyspark_file, zips, parent in seen:
        assert pyspark_file == pyspark.__file__, "workers import the installed package, not Spark's zip"
        assert zips == "", "Spark's zips are off the workers' path"
        assert f"-m {DAEMON_MODULE}" in parent, "the worker was forked by queueplane's daemon"
