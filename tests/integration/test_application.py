"""Several queues in one worker application: one Spark driver, a streaming query per queue.

A share, a consumer and a kmq queue run in one `queueplane run`. Each must end as it would
alone: its records accepted with their outputs, its poison in its own DLQ, its own series on
the application's one metrics endpoint; and all of it under one driver JVM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
from helpers import REPO
from worker_support import cluster_flags, make_queue, order, produce, read_all

from queueplane.local.processes import HOST, free_port

pytestmark = pytest.mark.kafka

RECORDS = 300
POISON = b"not json"


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return answer.read().decode()
    except OSError:
        return ""


def _readiness(port: int) -> str:
    """The status and reason /readyz answers (a 503 is an answer too)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return f"{answer.status} {answer.read().decode().strip()}"
    except urllib.error.HTTPError as refused:
        return f"{refused.code} {refused.read().decode().strip()}"


def _jvms(worker: subprocess.Popen) -> int:
    """Java processes under the worker: the driver's JVM and any other it started."""
    try:
        tree = psutil.Process(worker.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    java = 0
    for process in tree:
        try:
            java += process.name() == "java"
        except psutil.NoSuchProcess:  # a Python worker Spark ended between the listing and now
            continue
    return java


def test_a_share_a_consumer_and_a_kmq_queue_in_one_application_each_end_as_alone(kafka, tmp_path):
    queues = {kind: make_queue(tmp_path, kafka, group_type=kind) for kind in ("share", "consumer", "kmq")}
    names = {kind: q.spec_path.parent.name.replace("queue-", "w-") for kind, q in queues.items()}
    for queue in queues.values():
        produce(kafka, queue.topic, [*[order(i, sleep_ms=2) for i in range(RECORDS)], POISON])

    port = free_port(HOST)
    specs = [str(q.spec_path) for q in queues.values()]
    command = [sys.executable, "-m", "queueplane", "run", *specs, *cluster_flags(kafka, tmp_path)]
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [*command, "-o", "json", "--until-idle", "5s", "--metrics-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    seen_jvms, text = 0, ""
    try:
        deadline = time.monotonic() + 240
        # Every queue's dead letter on the one endpoint, each under its own name.
        wanted = [f'queueplane_records_total{{outcome="dlq",queue="{name}"}} 1.0' for name in names.values()]
        while time.monotonic() < deadline and worker.poll() is None:
            seen_jvms = max(seen_jvms, _jvms(worker))
            text = _scrape(port) or text
            if all(line in text for line in wanted):
                break
            time.sleep(1)
        assert all(line in text for line in wanted), f"{wanted} not all in:\n{text[-3000:]}\n{log.read_text()[-3000:]}"
        ready = _readiness(port)
        assert ready.startswith("200 all 3 queues"), ready
        stdout, _ = worker.communicate(timeout=240)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, log.read_text()[-3000:]
    assert seen_jvms == 1, f"{seen_jvms} JVMs under one application"

    summaries = {s["queue"]: s for s in json.loads(stdout)}
    assert set(summaries) == set(names.values())
    for kind, queue in queues.items():
        summary = summaries[names[kind]]
        assert summary["group_type"] == kind
        assert summary["counts"]["accepted"] == RECORDS and summary["counts"]["dlq"] == 1, (kind, summary["counts"])
        outputs = read_all(kafka, queue.output, expect_at_least=RECORDS, timeout_s=60)
        assert {json.loads(m.value())["id"] for m in outputs} == {f"id-{i:06d}" for i in range(RECORDS)}, kind
        dead = read_all(kafka, queue.dlq, expect_at_least=1, timeout_s=30)
        assert [m.value() for m in dead] == [POISON], kind
    # The share queue's calls ran in Python workers of its own, which no other queue's task used.
    share_pids = {e["pid"] for e in queues["share"].events()}
    other_pids = {e["pid"] for kind in ("consumer", "kmq") for e in queues[kind].events()}
    assert share_pids and other_pids and share_pids.isdisjoint(other_pids)
    # The log says which queue each progress line is about.
    lines = log.read_text()
    assert all(f"{name}: batch " in lines for name in names.values())


def test_a_queue_whose_query_fails_ends_alone_and_the_others_finish_their_records(kafka, tmp_path):
    good = make_queue(tmp_path, kafka, group_type="share")
    broken = make_queue(tmp_path, kafka, group_type="consumer")
    # The broken queue's handler module cannot be imported: each of its tasks fails, then its query.
    (module,) = broken.folder.glob("qp_handler_*.py")
    module.write_text('raise RuntimeError("this handler module is broken")\n')
    produce(kafka, good.topic, [order(i, sleep_ms=2) for i in range(RECORDS)])
    produce(kafka, broken.topic, [order(i) for i in range(10)])

    command = [sys.executable, "-m", "queueplane", "run", str(good.spec_path), str(broken.spec_path)]
    done = subprocess.run(
        [*command, *cluster_flags(kafka, tmp_path), "-o", "json", "--until-idle", "5s"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    broken_name = broken.spec_path.parent.name.replace("queue-", "w-")
    assert done.returncode != 0, done.stdout[-2000:]
    last_line = done.stderr.strip().splitlines()[-1]
    assert f"the streaming query of {broken_name} failed" in last_line, done.stderr[-3000:]
    good_name = good.spec_path.parent.name.replace("queue-", "w-")
    assert f"{good_name}: batch " in done.stderr
    outputs = read_all(kafka, good.output, expect_at_least=RECORDS, timeout_s=60)
    assert {json.loads(m.value())["id"] for m in outputs} == {f"id-{i:06d}" for i in range(RECORDS)}
