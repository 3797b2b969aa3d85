"""The worker's liveness and readiness rules (what the chart's probes ask), without Spark or a broker."""

from __future__ import annotations

import yaml
from helpers import EXAMPLES

from queueplane.provision import steps
from queueplane.run.health import (
    MIN_STALL_S,
    MIN_STARVE_S,
    ApplicationHealth,
    Health,
    stall_seconds,
    starve_seconds,
)


def test_ready_needs_a_started_query_and_a_recent_kafka_answer():
    health = Health(stall_s=600, kafka_stale_s=30)
    assert health.live(0).ok and not health.ready(0).ok  # nothing started yet
    health.query_started()
    assert "no answer yet" in health.ready(1).reason
    health.kafka_answered(10)
    assert health.ready(39).ok
    health.kafka_failed("Failed to resolve 'broker:9092'")
    verdict = health.ready(41)
    assert not verdict.ok and "31s ago" in verdict.reason and "Failed to resolve" in verdict.reason
    assert health.live(41).ok, "Kafka being away makes the worker unready, not dead"
    health.kafka_answered(42)
    assert health.ready(42).ok


def test_a_micro_batch_running_past_the_stall_bound_is_not_live():
    health = Health(stall_s=600)
    health.query_started()
    health.kafka_answered(0)
    health.batch_running(100, True)
    health.batch_running(650, True)  # still the same batch: its start counts
    assert health.live(699).ok
    assert not health.live(701).ok and not health.ready(701).ok
    health.batch_running(702, False)
    assert health.live(703).ok


def test_a_stopped_query_is_not_live():
    health = Health(stall_s=600)
    health.query_started()
    health.query_stopped("Kafka topic authorization failed")
    verdict = health.live(1)
    assert not verdict.ok and "authorization failed" in verdict.reason


def test_the_stall_bound_covers_every_delivery_with_its_backoff_and_is_never_short(tmp_path):
    payments = steps.validate([str(EXAMPLES / "payments" / "payment-events.yaml")], None)[
        0
    ]  # 20s lock, 30s backoff, 8 deliveries
    assert stall_seconds(payments) == 4 * 8 * (20 + 30)
    doc = yaml.safe_load((EXAMPLES / "payments" / "payment-events.yaml").read_text())
    doc["spec"]["group"].update(lockDuration="1s", deliveryLimit=2)
    doc["spec"]["retry"] = {"backoff": "100ms", "maxBackoff": "1s"}
    quick = tmp_path / "quick.yaml"
    quick.write_text(yaml.safe_dump(doc))
    assert stall_seconds(steps.validate([str(quick)], None)[0]) == MIN_STALL_S


def test_records_that_wait_while_every_batch_comes_back_empty_make_the_worker_unready():
    health = Health(stall_s=600, starve_s=120)
    health.query_started()
    health.kafka_answered(0)
    health.batch_handled(0, waiting=500, handled=0)
    health.kafka_answered(100)
    health.batch_handled(100, waiting=500, handled=0)
    assert health.ready(119).ok, "a short wait is a lock or a backoff running out"
    health.kafka_answered(121)
    verdict = health.ready(121)
    assert not verdict.ok and "500 records wait" in verdict.reason and "121s" in verdict.reason
    assert health.live(121).ok, "idle, not stuck: a restart is not the cure"
    health.batch_handled(122, waiting=480, handled=20)
    assert health.ready(122).ok and health.starved(300) is None


def test_an_empty_backlog_or_one_kafka_does_not_tell_is_not_starvation():
    health = Health(stall_s=600, starve_s=120)
    health.query_started()
    health.batch_handled(0, waiting=500, handled=0)
    health.batch_handled(50, waiting=0, handled=0)
    health.batch_handled(100, waiting=None, handled=0)
    health.kafka_answered(500)
    assert health.starved(500) is None and health.ready(500).ok


def test_the_starvation_bound_covers_three_lock_and_backoff_cycles_and_is_never_short():
    payments = steps.validate([str(EXAMPLES / "payments" / "payment-events.yaml")], None)[0]  # 20s lock, 30s backoff
    assert starve_seconds(payments) == 3 * (20 + 30)
    coffee = steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]
    assert starve_seconds(coffee) >= MIN_STARVE_S


def test_an_application_is_ready_only_while_every_queue_is_and_says_which_is_not():
    queues = {name: Health(stall_s=600, kafka_stale_s=30) for name in ("orders", "refunds")}
    application = ApplicationHealth(queues)
    for health in queues.values():
        health.query_started()
        health.kafka_answered(0)
    assert application.ready(10).ok and application.ready(10).reason.startswith("all 2 queues")
    queues["refunds"].kafka_refused("Kafka refused the worker's principal: not authorized to read refunds")
    verdict = application.ready(11)
    assert not verdict.ok and verdict.reason.startswith("refunds: Kafka refused") and "orders" not in verdict.reason
    assert application.live(11).ok, "a refused queue makes the application unready, not dead"
    queues["orders"].query_stopped("the query failed")
    assert not application.live(12).ok and application.live(12).reason.startswith("orders: ")


def test_an_application_of_one_queue_answers_as_the_queue_does():
    health = Health(stall_s=600)
    assert ApplicationHealth({"orders": health}).ready(0) == health.ready(0)


def test_a_part_beside_the_query_that_rides_out_a_kafka_fault_makes_the_worker_unready_not_dead():
    why: list[str | None] = [None]
    health = Health(stall_s=600, degraded=lambda: why[0])
    health.query_started()
    health.kafka_answered(0)
    assert health.ready(1).ok
    why[0] = "kmq tracker: redelivering the deliveries due has failed for 12s: broker down"
    verdict = health.ready(2)
    assert not verdict.ok and verdict.reason == why[0]
    assert health.live(2).ok, "it rides the fault out: live, so nothing restarts it"
    why[0] = None
    assert health.ready(3).ok
