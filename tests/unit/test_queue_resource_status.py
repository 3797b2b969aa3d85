"""The Queue status a driver reports: phase, rate, conditions and the last error, from its observations."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from queueplane.deploy.kube_schema import object_problems
from queueplane.deploy.render import chart_kinds
from queueplane.run.driver.health import Verdict
from queueplane.run.driver.queue_status import (
    MISSING_EXECUTORS_S,
    Observation,
    StatusBuilder,
    StatusReporter,
)

T0 = 1_800_000_000.0
READY = Verdict(True, "the query runs and Kafka answers")


def observed(**changes) -> Observation:
    base = Observation(
        at=T0,
        phase="Running",
        ready=READY,
        lag=0,
        oldest_s=0.0,
        finished=0,
        dead_lettered=0,
        dead_letters=0,
        executors_running=1,
        executors_requested=1,
        max_executors=4,
        target_lag_s=30.0,
        last_error=None,
    )
    return dataclasses.replace(base, **changes)


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def as_stored(status: dict) -> dict:
    """What the API server keeps of a merge patch: a null removes the field."""
    return {k: v for k, v in status.items() if v is not None}


def test_rate_is_finished_records_over_the_interval_and_every_status_fits_the_crd():
    builder = StatusBuilder()
    first = builder.status(observed(finished=100))
    second = builder.status(observed(at=T0 + 5, finished=600, lag=42, oldest_s=75.0, dead_letters=3))
    assert first["ratePerSecond"] == 0.0 and second["ratePerSecond"] == 100.0
    assert (second["lag"], second["oldest"], second["deadLetters"]) == (42, "1m15s", 3)
    assert second["executors"] == "1/1" and second["updated"] == "2027-01-15T08:00:05Z"
    custom = chart_kinds()
    for status in (first, second, builder.status(observed(at=T0 + 10, lag=None, oldest_s=None, dead_letters=None))):
        queue = {
            "apiVersion": "queueplane.io/v1",
            "kind": "Queue",
            "metadata": {"name": "q", "namespace": "team"},
            "spec": {"topic": {"name": "t"}, "group": {"type": "share", "id": "g"}, "processing": {"handler": "m:f"}},
            "status": as_stored(status),
        }
        assert object_problems(queue, custom) == []


def test_lagging_compares_the_oldest_wait_with_the_target_and_is_unknown_without_it():
    builder = StatusBuilder()
    assert conditions(builder.status(observed(oldest_s=12.0)))["Lagging"]["status"] == "False"
    over = conditions(builder.status(observed(at=T0 + 5, oldest_s=95.0)))["Lagging"]
    assert (over["status"], over["reason"]) == ("True", "OverTarget")
    assert "1m35s" in over["message"] and "30s" in over["message"]
    unknown = conditions(builder.status(observed(at=T0 + 10, oldest_s=None)))["Lagging"]
    assert (unknown["status"], unknown["reason"]) == ("Unknown", "AgeUnknown")


def test_dead_lettering_is_true_only_while_records_go_to_the_dlq():
    builder = StatusBuilder()
    builder.status(observed())
    hit = conditions(builder.status(observed(at=T0 + 5, dead_lettered=7)))["DeadLettering"]
    assert (hit["status"], hit["reason"]) == ("True", "RecordsDeadLettered") and "7 records" in hit["message"]
    assert conditions(builder.status(observed(at=T0 + 10, dead_lettered=7)))["DeadLettering"]["status"] == "False"


def test_a_condition_keeps_its_transition_time_until_its_status_changes():
    builder = StatusBuilder()
    since = conditions(builder.status(observed()))["Ready"]["lastTransitionTime"]
    assert conditions(builder.status(observed(at=T0 + 60)))["Ready"]["lastTransitionTime"] == since
    down = conditions(builder.status(observed(at=T0 + 120, ready=Verdict(False, "Kafka last answered 40s ago"))))
    assert down["Ready"]["status"] == "False" and down["Ready"]["lastTransitionTime"] == "2027-01-15T08:02:00Z"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"ready": Verdict(False, "Kafka last answered 31s ago: timed out")}, "NotReady"),
        ({"oldest_s": 300.0, "executors_running": 4, "executors_requested": 4}, "AtMaxExecutors"),
    ],
)
def test_a_running_queue_that_cannot_keep_up_or_work_shows_degraded_with_the_reason(changes, reason):
    status = StatusBuilder().status(observed(**changes))
    degraded = conditions(status)["Degraded"]
    assert status["phase"] == "Degraded" and (degraded["status"], degraded["reason"]) == ("True", reason)


def test_executors_missing_only_degrade_after_they_stay_missing():
    builder = StatusBuilder()
    short = observed(executors_running=1, executors_requested=3)
    assert builder.status(short)["phase"] == "Running", "scaling up takes a while: not degraded at once"
    later = builder.status(dataclasses.replace(short, at=T0 + MISSING_EXECUTORS_S))
    assert later["phase"] == "Degraded" and conditions(later)["Degraded"]["reason"] == "ExecutorsMissing"
    assert "2 of 3" in conditions(later)["Degraded"]["message"]
    back = builder.status(observed(at=T0 + MISSING_EXECUTORS_S + 5, executors_running=3, executors_requested=3))
    assert back["phase"] == "Running"


def test_failed_and_stopped_phases_and_the_last_error_stays_with_its_time():
    builder = StatusBuilder()
    builder.status(observed(last_error="partition 2 offset 17: ValueError: not JSON"))
    later = builder.status(observed(at=T0 + 30))
    assert later["lastError"] == "partition 2 offset 17: ValueError: not JSON"
    assert later["lastErrorTime"] == "2027-01-15T08:00:00Z"
    failed = builder.status(observed(at=T0 + 35, phase="Failed", last_error="the query stopped: OOM"))
    assert failed["phase"] == "Failed" and conditions(failed)["Degraded"]["reason"] == "QueryFailed"
    assert failed["lastError"] == "the query stopped: OOM"
    assert builder.status(observed(at=T0 + 40, phase="Stopped"))["phase"] == "Stopped"


def test_a_failing_patch_is_logged_once_and_never_raises(caplog):
    calls: list[dict] = []
    failing = [True]

    def patch(status: dict) -> None:
        calls.append(status)
        if failing[0]:
            raise OSError("PATCH https://.../queues/q/status: 403 forbidden")

    reporter = StatusReporter(lambda: observed(), patch, every_s=3600)
    with caplog.at_level(logging.INFO, logger="queueplane.worker"):
        reporter.report()
        reporter.report()
        failing[0] = False
        reporter.report()
    messages = [r.getMessage() for r in caplog.records]
    assert len(calls) == 3
    assert sum("could not be written" in m for m in messages) == 1 and "403 forbidden" in messages[0]
    assert messages[-1] == "the Queue status is written again"
