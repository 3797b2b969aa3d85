"""The driver reads a query's state once a second, and at once when a query of the application ended.

Each read is a few calls to Spark's JVM (isActive, status); the driver's loop runs four times a
second for every query of the application, so a read on each pass was most of an idle
application's driver time. A stop is an event the loop sees on every pass, without a call.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from specs_factory import dump, spec

from queueplane.kafka.target import KafkaTarget
from queueplane.run.driver import queue_run
from queueplane.run.driver.options import RunOptions
from queueplane.run.driver.queue_run import LOOK_S, QueueJob, QueueRun
from queueplane.spec.rules import check_text


class Query:
    """The query's state as the driver reads it, counting the reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.active = True

    @property
    def isActive(self) -> bool:  # pyspark's name
        self.reads += 1
        return self.active

    @property
    def status(self) -> dict:
        return {"isTriggerActive": False}


@pytest.fixture
def run(monkeypatch) -> QueueRun:
    clock = [1000.0]
    monkeypatch.setattr(queue_run.time, "monotonic", lambda: clock[0])
    (queue,) = check_text(dump(spec("consumer"))).raise_if_invalid()
    run = QueueRun(QueueJob(queue), KafkaTarget({"bootstrap.servers": "127.0.0.1:1"}), RunOptions())
    run.query = Query()
    run.controller = SimpleNamespace(on_waiting=lambda _waiting: None)
    run._looked_at = clock[0]
    run.clock = clock  # type: ignore[attr-defined]
    return run


def test_a_query_is_read_once_a_second_while_nothing_ends(run):
    clock = run.clock
    for _ in range(8):  # two seconds of the loop's passes, four a second
        clock[0] += LOOK_S / 4
        assert run.watch(False) is False
    assert run.query.reads == 2


def test_an_ended_query_is_seen_on_the_pass_that_says_one_ended(run):
    run.query.active = False
    assert run.watch(True) is True
    assert run.query.reads == 1


def test_a_stop_ends_the_run_on_the_next_pass_without_reading_the_query(run):
    run.stop_requested.set()
    assert run.watch(False) is True
    assert run.query.reads == 0
