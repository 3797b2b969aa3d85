"""A worker whose micro-batches stop ending while records wait is not ready, and says why once.

Spark's Python worker processes of a consumer queue are frozen (SIGSTOP) while records are
produced: no batch ends, so the sink never runs, and only the driver's backlog watcher sees the
records wait. The worker must turn not ready with the reason, log one error line, and once the
processes go on, be ready again and handle every record.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.request

import psutil
import pytest
from worker_support import make_queue, order, produce, read_all, resume, start_worker

from queueplane.local.processes import HOST, free_port

pytestmark = pytest.mark.kafka

BEFORE, DURING = 20, 40
STOPPED = "batches have stopped"


def _readiness(port: int) -> tuple[int, str]:
    """The status and reason /readyz answers (a 503 is an answer too); 0 while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode().strip()
    except OSError:
        return 0, ""


class _Frozen:
    """Spark's Python processes of a worker (its daemon, Python workers and planners: everything
    Python under the driver's JVM), stopped; the driver and its JVM run on."""

    def __init__(self, worker_pid: int):
        self.driver = psutil.Process(worker_pid)
        self.stopped: list[psutil.Process] = []

    def spark_python(self) -> list[psutil.Process]:
        found = []
        for process in self.driver.children(recursive=True):
            try:
                if process.name() != "java" and any(p.name() == "java" for p in process.parents()):
                    found.append(process)
            except psutil.NoSuchProcess:
                continue
        return found

    def stop(self) -> None:
        for _ in range(2):  # again after stopping: a process forked while the first list was taken
            for process in self.spark_python():
                if process not in self.stopped:
                    self.stopped.append(process)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.suspend()


def test_a_worker_whose_batches_stop_while_records_wait_is_not_ready_and_says_so_once(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering="partition", partitions=2)
    produce(kafka, queue.topic, [order(i) for i in range(BEFORE)])
    port, log = free_port(HOST), tmp_path / "worker.log"
    worker = start_worker(queue, kafka, "--until-idle", "5s", "--metrics-port", str(port), log=log)
    frozen, name = _Frozen(worker.pid), queue.spec_path.parent.name.replace("queue-", "w-")

    def wait_for(what: str, check, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert worker.poll() is None, f"the worker ended before {what}:\n{log.read_text()[-3000:]}"
            found = check()
            if found:
                return found
            time.sleep(0.5)
        raise AssertionError(f"no {what} within {timeout_s:.0f}s: {_readiness(port)}\n{log.read_text()[-3000:]}")

    try:
        wait_for("first records handled", lambda: queue.count_events() >= BEFORE, 180)
        wait_for("readiness", lambda: _readiness(port)[0] == 200, 60)
        frozen.stop()
        assert frozen.stopped, "no Spark Python process to stop"
        produce(kafka, queue.topic, [order(i) for i in range(BEFORE, BEFORE + DURING)])

        status, reason = wait_for("not ready: batches stopped", lambda: STOPPED in (r := _readiness(port))[1] and r, 90)
        assert status == 503 and "records wait and no micro-batch has ended for" in reason, reason
        assert int(reason.split(" ")[0]) >= DURING, reason
        # A few more of the watcher's looks (one a second) while the batches stay stopped: no more lines.
        seconds = int(re.search(r"ended for (\d+)s", reason).group(1))
        wait_for(
            "the stop to go on",
            lambda: (m := re.search(r"ended for (\d+)s", _readiness(port)[1])) and int(m.group(1)) >= seconds + 4,
            30,
        )
        errors = [line for line in log.read_text().splitlines() if STOPPED in line]
        assert len(errors) == 1, errors
        assert f"{name}: " in errors[0] and "records wait" in errors[0], errors[0]
    finally:
        resume(frozen.stopped)

    wait_for("readiness again", lambda: _readiness(port)[0] == 200, 90)
    worker.wait(180)
    assert worker.returncode == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "micro-batches end again" in text, text[-3000:]
    assert sum(STOPPED in line for line in text.splitlines()) == 1
    summary = json.loads(worker.stdout.read())
    assert summary["lag_at_exit"] == 0 and summary["counts"]["dlq"] == 0, summary
    wanted = {f"id-{i:06d}" for i in range(BEFORE + DURING)}
    assert {e["id"] for e in queue.events() if e.get("result") == "ok"} == wanted, "every record handled"
    outputs = read_all(kafka, queue.output, expect_at_least=len(wanted), timeout_s=60)
    assert {json.loads(m.value())["id"] for m in outputs} == wanted, "nothing lost"
