"""When an ``--until-idle`` worker may stop: never on a lag read older than records its runtime
put back on the queue's topic (kmq's redeliveries), which are records to come like any batch's."""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

from queueplane.run.driver.backlog_watcher import BacklogWatcher
from queueplane.run.driver.health import Health
from queueplane.run.driver.options import RunOptions
from queueplane.run.driver.queue_run import QueueRun


class _Runtime:
    """A runtime whose tracker is idle: it holds no open delivery."""

    def __init__(self) -> None:
        self.requeued: float | None = None

    def idle(self) -> bool:
        return True

    def requeued_at(self) -> float | None:
        return self.requeued


def _run(lags: list[dict[int, int | None]]) -> tuple[QueueRun, BacklogWatcher, _Runtime]:
    """A queue run of ``--until-idle 5s`` whose last batch with records ended 10 s ago."""
    answers = iter(lags)
    watcher = BacklogWatcher(lambda: next(answers), Health(stall_s=60))
    watcher.answering_since = time.monotonic() - 60
    run = QueueRun.__new__(QueueRun)
    runtime = _Runtime()
    run.options = RunOptions(until_idle_s=5)
    run.termination = SimpleNamespace(requested=threading.Event())
    run.counts = Counter()
    run.started = time.monotonic() - 60
    run.last_activity = time.monotonic() - 10
    run.watcher, run.runtime = watcher, runtime
    return run, watcher, runtime


def test_an_idle_caught_up_queue_stops():
    run, watcher, _ = _run([{0: 0}])
    watcher.read_now()
    assert run.should_stop(watcher.latest)


def test_records_put_back_after_the_last_lag_read_keep_the_worker_running_until_a_later_read():
    run, watcher, runtime = _run([{0: 0}, {0: 0}])
    watcher.read_now()
    runtime.requeued = time.monotonic()  # the tracker redelivered after that read began
    assert not run.should_stop(watcher.latest), "a lag of 0 read before the redelivery says nothing of it"
    runtime.requeued = time.monotonic() - 10  # long enough ago, and a read began after it
    watcher.read_now()
    assert run.should_stop(watcher.latest)


def test_idle_time_counts_from_the_last_redelivery():
    run, watcher, runtime = _run([{0: 0}])
    runtime.requeued = time.monotonic() - 1  # redelivered a second ago, and consumed at once
    watcher.read_now()
    assert not run.should_stop(watcher.latest), "one second since the redelivery, under --until-idle 5s"
