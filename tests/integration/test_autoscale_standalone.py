"""The autoscaling controller against a real Spark scheduler: a standalone master and worker.

A producer adds records faster than one executor handles them, so the backlog grows; the
controller in the driver asks the master for executors and the master starts them; when
the load ends and the backlog drains, the controller gives them back.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

import pytest
import yaml
from helpers import REPO
from spark_standalone import SPARK_SUBMIT, free_port, spark_env, start_standalone
from worker_support import make_queue, order, produce

pytestmark = [pytest.mark.kafka, pytest.mark.heavy]

MAX_EXECUTORS = 3
LOAD_SECONDS, PER_SECOND = 40, 40  # ~40 records/s; one executor (2 slots, 100 ms each) handles ~20/s
LOAD = LOAD_SECONDS * PER_SECOND
WARM_UP = 4  # records before the load, to start the first batch
# After the load, a trickle keeps records in flight while the backlog is gone and the controller
# scales down: a scale-down that skipped the drain would redeliver what the killed executor held.
TRICKLE_SECONDS, TRICKLE_PER_SECOND, TRICKLE_MS = 30, 3, 300
TRICKLE = TRICKLE_SECONDS * TRICKLE_PER_SECOND


def _trim_at(cores: list[int]) -> int | None:
    """Where the master's core count, having risen above one at start-up, came back to one."""
    above = next((i for i, c in enumerate(cores) if c > 1), None)
    if above is None:
        return None
    return next((i for i in range(above, len(cores)) if cores[i] == 1), None)


def test_growing_lag_adds_executors_on_the_master_and_they_go_when_it_drains(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, partitions=3, concurrency=2, lock="20s")
    doc = yaml.safe_load(queue.spec_path.read_text())
    doc["spec"]["autoscaling"] = {"minExecutors": 1, "maxExecutors": MAX_EXECUTORS, "targetLagSeconds": 5}
    doc["spec"]["deployment"] = {"executor": {"cores": 1, "memory": "512m"}}
    queue.spec_path.write_text(yaml.safe_dump(doc))
    cluster = start_standalone(tmp_path / "spark", cores=MAX_EXECUTORS, memory="3g")
    stop = threading.Event()
    timeline: list[tuple[float, int]] = []
    try:
        command = [
            str(SPARK_SUBMIT),
            "--master",
            cluster.master_url,
            *("--conf", "spark.executor.cores=1", "--conf", "spark.executor.memory=512m"),
            *("--conf", f"spark.cores.max={MAX_EXECUTORS}", "--conf", "spark.executor.instances=1"),
            *("--conf", "spark.dynamicAllocation.enabled=false", "--conf", "spark.ui.enabled=false"),
            str(REPO / "spark_apps" / "queue_worker.py"),
            *("--spec", str(queue.spec_path), "--metrics-port", str(free_port()), "--metrics-host", "127.0.0.1"),
            *("--until-idle", "25s", "--scale-interval", "3s", "--scale-down-cooldown", "6s"),
        ]
        env = {**spark_env(), "QUEUEPLANE_BOOTSTRAP_SERVERS": kafka.bootstrap, "PYSPARK_PYTHON": sys.executable}
        driver = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=(tmp_path / "driver.log").open("w"), text=True
        )

        def watch() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    timeline.append((time.time(), cluster.cores_used()))
                time.sleep(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # The master starts as many executors as it has cores; the driver trims them to one at
        # its first batch. A few records start that batch, and the load waits for the trim, so
        # that every executor beyond one is the controller's request, not the start-up's.
        produce(kafka, queue.topic, [order(LOAD + i, sleep_ms=100) for i in range(WARM_UP)])
        trimmed_by = time.monotonic() + 240
        while _trim_at([c for _, c in timeline]) is None:
            if driver.poll() is not None:
                raise AssertionError(f"the driver ended before the trim: {driver.communicate()[0][-4000:]}")
            assert time.monotonic() < trimmed_by, f"no trim to one executor: {[c for _, c in timeline]}"
            time.sleep(0.5)
        for second in range(LOAD_SECONDS):
            batch = [order(second * PER_SECOND + i, sleep_ms=100) for i in range(PER_SECOND)]
            produce(kafka, queue.topic, batch)
            time.sleep(1)
        trickle_from = time.time()
        for second in range(TRICKLE_SECONDS):
            first = LOAD + WARM_UP + second * TRICKLE_PER_SECOND
            produce(kafka, queue.topic, [order(first + i, sleep_ms=TRICKLE_MS) for i in range(TRICKLE_PER_SECOND)])
            time.sleep(1)
        trickle_to = time.time()
        out, _ = driver.communicate(timeout=600)
        assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-4000:]
    finally:
        stop.set()
        cluster.stop()
    (tmp_path / "driver.out").write_text(out)
    # The driver's stdout holds its log lines (spark-submit joins them) and, last, the JSON summary.
    summary = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))
    assert summary["counts"]["accepted"] == LOAD + WARM_UP + TRICKLE
    assert summary["counts"]["released"] == 0 and summary["counts"]["dlq"] == 0, summary["counts"]
    events = queue.events()
    handled = [e["id"] for e in events]
    assert len(handled) == len(set(handled)) == LOAD + WARM_UP + TRICKLE, "each record handled once, none redelivered"
    again = sorted((e["start"], e["partition"], e["offset"], e["dc"], e["pid"]) for e in events if e["dc"] != 1)
    drops_at = [t for (t, c), (_, before) in zip(timeline[1:], timeline, strict=False) if c < before]
    decisions = summary["scaling"]
    ups = [d for d in decisions if d["desired"] > d["requested"]]
    downs = [d for d in decisions if d["desired"] < d["requested"]]
    assert ups and downs, decisions
    assert max(d["running"] for d in decisions) >= 2, "the master started the requested executors"
    # The master's own count: after the start-up trim to one executor, it rose, then fell back to one.
    cores = [c for _, c in timeline]
    trim_at = _trim_at(cores)
    assert trim_at is not None, cores
    peak_at = max(range(trim_at, len(cores)), key=lambda i: cores[i])
    assert cores[peak_at] >= 2, f"master cores every 0.5 s: {cores}; decisions: {decisions}"
    assert 1 in cores[peak_at:], f"executors never fell back to one: {cores[peak_at:]}"
    # An executor went while the trickle ran, so records were in flight around it.
    assert any(trickle_from <= t <= trickle_to for t in drops_at), (
        f"no scale-down during the trickle ({trickle_from:.0f}-{trickle_to:.0f}): drops at {drops_at}"
    )
    # No record came a second time: before its executor went, every consumer handled what it had
    # acquired and left the group, so none handed a record back (that costs it a delivery).
    assert not again, (
        f"{len(again)} records came a second time after a scale-down, e.g. "
        f"(start, partition, offset, delivery, pid) {again[:5]}; executors dropped at {drops_at}"
    )
