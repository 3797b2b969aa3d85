"""Idle planning daemons of the application's JVM are stopped; busy ones and others are not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from queueplane.run.spark.planner_daemons import PlannerReaper, is_planner_daemon

# A stand-in with the command line of a daemon; with FAKE_WORKER set, it has a child (a worker).
FAKE = """
import os, subprocess, sys, time
if os.environ.get("FAKE_WORKER"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
time.sleep(60)
"""


def _daemon(module: str, with_worker: bool = False) -> subprocess.Popen:
    env = {**os.environ, "FAKE_WORKER": "1" if with_worker else ""}
    return subprocess.Popen([sys.executable, "-c", FAKE, "pyspark.daemon", module], env=env)


def test_a_planning_daemon_without_a_worker_is_stopped_once_idle_long_enough():
    idle = _daemon("pyspark.sql.worker.create_data_source")
    busy = _daemon("pyspark.sql.worker.plan_data_source_read", with_worker=True)
    tasks = _daemon("pyspark.worker")  # runs tasks: never stopped
    try:
        time.sleep(1.0)  # the busy one has started its worker
        reaper = PlannerReaper(jvm_pid=os.getpid(), idle_s=5.0)
        assert reaper.sweep(now=100.0) == [], "first seen idle: not yet"
        assert reaper.sweep(now=104.0) == []
        assert reaper.sweep(now=105.0) == [idle.pid]
        assert idle.wait(10) is not None
        assert busy.poll() is None and tasks.poll() is None
    finally:
        for process in (idle, busy, tasks):
            process.kill()
            process.wait()


def test_only_pysparks_planning_daemons_count():
    assert is_planner_daemon(["python3", "-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"])
    assert not is_planner_daemon(["python3", "-m", "pyspark.daemon", "pyspark.worker"])
    assert not is_planner_daemon(["python3", "-m", "queueplane.run.spark.daemon", "pyspark.worker"])
    assert not is_planner_daemon(["python3"])
