"""A worker's session keeps a bounded history in Spark's status store.

A worker runs a micro-batch a second for weeks, and Spark's status store keeps, by default, the
last 1000 jobs, stages and SQL executions even without a UI: twenty minutes of history in the
driver's heap. The session queueplane builds keeps a few minutes' worth
(``RETAINED_IN_STATUS_STORE``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from helpers import close_spark_gateway

from queueplane.run.spark.session import RETAINED_IN_STATUS_STORE, spark_session


@pytest.fixture(scope="module", autouse=True)
def _gateway_closed_after() -> Iterator[None]:
    yield
    close_spark_gateway()


class _Runtime:
    """The least a queue's runtime gives the session."""

    queue = SimpleNamespace(
        name="q", source=__file__, memory_mi=lambda role: 512, group=SimpleNamespace(delivery_limit=1)
    )
    shuffle_partitions = 1

    def configure(self, builder):
        return builder

    def local_threads(self) -> int:
        return 1


def test_the_status_store_forgets_jobs_and_sql_executions_past_its_bound(monkeypatch):
    monkeypatch.setitem(os.environ, "PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setitem(os.environ, "PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", ""))
    spark = spark_session([_Runtime()], "status-store-test", local=True, event_log_dir=None, kafka_settings={})
    try:
        bound = int(RETAINED_IN_STATUS_STORE)
        frame = spark.range(3)
        for _ in range(bound + bound // 2):
            frame.count()  # a job and an SQL execution each, on the JVM alone
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
        executions = spark._jsparkSession.sharedState().statusStore().executionsCount()
        assert bound // 2 <= len(jobs) <= bound, len(jobs)
        assert executions <= bound, executions
    finally:
        spark.stop()
