"""processing.setup and processing.teardown in the worker's Python processes, on the real broker and Spark.

Every runtime takes its process state through one registry (queueplane.run.executor.processes), where
setup runs; teardown runs where a process ends (every runtime alike) and where a share process
drains. So one group type that only ends (consumer) and the one that drains (share) cover it.
"""

from __future__ import annotations

import psutil
import pytest
import yaml
from helpers import wait_for
from specs_factory import dump
from worker_support import make_queue, order, produce, run_worker

pytestmark = pytest.mark.kafka

COUNT = 40
HOOKS_SOURCE = """
import os, time

LOG = "{log}"


def _note(what):
    with open(LOG, "a") as handle:
        handle.write(f"{{what}} {{os.getpid()}} {{time.time()!r}}\\n")


def setup():
    _note("setup")


def teardown():
    _note("teardown")
"""


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("group_type", ["consumer", "share"])
def test_setup_runs_once_in_a_process_before_its_first_call_and_teardown_when_it_stops(group_type, tmp_path, kafka):
    queue = make_queue(tmp_path, kafka, group_type=group_type, partitions=2)
    log = queue.folder / "hooks.log"
    module = f"qp_hooks_{queue.group}".replace("-", "_")
    (queue.folder / f"{module}.py").write_text(HOOKS_SOURCE.format(log=log))
    doc = yaml.safe_load(queue.spec_path.read_text())
    doc["spec"]["processing"].update(setup=f"{module}:setup", teardown=f"{module}:teardown")
    queue.spec_path.write_text(dump(doc))
    produce(kafka, queue.topic, [order(i) for i in range(COUNT)])

    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == COUNT, summary["counts"]

    calls = queue.events()
    noted = [line.split() for line in log.read_text().splitlines()]
    pids = {call["pid"] for call in calls} | {int(pid) for _, pid, _ in noted}
    # The worker's Python processes end after the driver stopped Spark: wait for them, then read.
    wait_for("the worker's Python processes to end", lambda: all(_ended(pid) for pid in pids), 60, 0.5)
    noted = [line.split() for line in log.read_text().splitlines()]
    for pid in pids:
        hooks = [(what, float(at)) for what, noted_pid, at in noted if int(noted_pid) == pid]
        order_of = [what for what, _ in hooks]
        # Setup once, then teardown; a share process that drains and is given work again sets up again.
        assert order_of and order_of == ["setup", "teardown"] * (len(order_of) // 2), (pid, order_of)
        if group_type == "consumer":
            assert order_of == ["setup", "teardown"], (pid, order_of)
        first_call = min((call["start"] for call in calls if call["pid"] == pid), default=None)
        if first_call is not None:
            assert hooks[0][1] <= first_call, f"process {pid} called its handler before its setup"
