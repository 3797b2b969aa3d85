"""The worker's liveness and readiness rules (what the chart's probes ask), without Spark or a broker."""

from __future__ import annotations

import logging

import yaml
from helpers import EXAMPLES

from queueplane.kafka.target import KafkaTarget
from queueplane.provision import steps
from queueplane.run.consumer.runtime import ConsumerRuntime
from queueplane.run.driver.backlog_watcher import BacklogWatcher
from queueplane.run.driver.health import (
    MIN_STALL_S,
    MIN_STARVE_S,
    MIN_STOPPED_S,
    ApplicationHealth,
    Health,
    stall_seconds,
    starve_seconds,
    stopped_seconds,
)
from queueplane.run.driver.options import RunOptions
from queueplane.run.driver.runtime import QueueRuntime
from queueplane.run.kmq.runtime import KmqRuntime
from queueplane.run.share.runtime import ShareRuntime


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


def _running(health: Health, now: float, waiting: int) -> None:
    """The query started at ``now`` and Kafka answers that ``waiting`` records wait."""
    health.query_started(now)
    health.kafka_answered(now)
    health.backlog_seen(waiting)


def test_records_that_wait_while_no_micro_batch_ends_make_the_worker_unready_until_one_ends():
    health = Health(stall_s=600, longest_batch_s=15)  # time slices of 15 s at most: bound 30 s
    _running(health, 0, waiting=500)
    health.batch_handled(10, waiting=500, handled=20)
    health.batch_running(11, True)  # the next batch starts, and never ends
    health.kafka_answered(41)
    assert health.ready(40).ok, "one slow slice is no stop"
    verdict = health.ready(41)
    assert not verdict.ok
    assert verdict.reason == "500 records wait and no micro-batch has ended for 31s (bound 30s): batches have stopped"
    assert health.live(41).ok, "not ready: the stall bound alone restarts a worker"
    health.batch_handled(42, waiting=480, handled=20)
    assert health.ready(42).ok and health.stopped(72) is None


def test_batches_that_never_ended_since_the_query_started_count_from_its_start():
    health = Health(stall_s=600, longest_batch_s=15)
    _running(health, 100, waiting=7)
    health.kafka_answered(131)
    assert health.stopped(130) is None
    verdict = health.ready(131)
    assert not verdict.ok and verdict.reason.startswith("7 records wait and no micro-batch has ended for 31s")


def test_no_micro_batch_ending_while_nothing_waits_or_kafka_cannot_tell_is_an_idle_worker():
    health = Health(stall_s=600, longest_batch_s=15)
    _running(health, 0, waiting=0)
    health.kafka_answered(500)
    assert health.stopped(500) is None and health.ready(500).ok
    health.backlog_seen(None)  # a read that failed, or a lag the listener cannot tell
    assert health.stopped(500) is None
    health.backlog_seen(3)
    assert health.stopped(500) is not None


def test_where_a_batch_lasts_as_long_as_its_records_only_the_idle_trigger_counts():
    health = Health(stall_s=600, longest_batch_s=None)  # Spark's Kafka source (kmq)
    assert health.stopped_s == MIN_STOPPED_S
    _running(health, 0, waiting=200)
    health.batch_running(1, True)
    health.batch_running(200, True)  # a slow handler's long batch: the stall bound's, not this rule's
    health.kafka_answered(200)
    assert health.stopped(200) is None and health.ready(200).ok
    health.batch_handled(210, waiting=200, handled=100)
    health.batch_running(211, False)  # the trigger sits idle while records wait
    health.kafka_answered(240)
    assert health.stopped(240) is None
    verdict = health.ready(241)
    assert not verdict.ok
    assert verdict.reason == "200 records wait and no micro-batch has run for 31s (bound 30s): batches have stopped"
    health.batch_running(242, True)
    assert health.ready(242).ok


def test_the_stopped_bound_is_two_of_the_runtimes_longest_batches_and_never_under_the_floor():
    assert stopped_seconds(None) == MIN_STOPPED_S
    assert stopped_seconds(1) == MIN_STOPPED_S
    assert stopped_seconds(15) == 30
    assert stopped_seconds(90) == 180


def test_time_sliced_runtimes_say_their_longest_batch_and_spark_s_kafka_source_none():
    target = KafkaTarget({"bootstrap.servers": "kafka-1:9092"}, "kafka-1:9092")
    payments = steps.validate([str(EXAMPLES / "payments" / "payment-events.yaml")], None)[0]
    coffee = steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]
    local, cluster = RunOptions(local=True, tasks=2), RunOptions(local=False)
    # A local worker runs every task at once: one idle slice (15 s).
    assert ConsumerRuntime(payments, target, local).longest_batch_s == 15
    assert ShareRuntime(coffee, target, local).longest_batch_s == 15
    # On executors, the tasks of the most executors in turns on the fewest: payments' 12 partitions
    # on 2 executors of 2 cores, coffee's 6 executors' 12 tasks on 1 of 2 cores.
    assert ConsumerRuntime(payments, target, cluster).longest_batch_s == 3 * 15
    assert ShareRuntime(coffee, target, cluster).longest_batch_s == 6 * 15

    class SparkKafkaSource(QueueRuntime):
        group_type = "test"

        def stream(self, spark, drain_file, executor_ceiling):
            return None

    assert SparkKafkaSource(payments, target, cluster).longest_batch_s is None
    # kmq's members are leased by the same slices: email-jobs' 4 partitions on 1 executor of 1 core.
    emails = steps.validate([str(EXAMPLES / "messaging" / "email-jobs.yaml")], None)[0]
    for options, longest in ((local, 15), (cluster, 4 * 15)):
        kmq = KmqRuntime(emails, target, options)
        try:
            assert kmq.longest_batch_s == longest
        finally:  # its redeliverer's producer, left open, logged failed lookups into later tests
            kmq.redeliverer.close()


def test_the_watcher_logs_one_error_when_batches_stop_and_one_line_when_one_ends(caplog):
    health = Health(stall_s=600, longest_batch_s=15, name="brew-orders")
    lags = iter([{0: 300, 1: 200}] * 3 + [RuntimeError("no leaders"), {0: 0, 1: None}, {0: 300, 1: None}] * 2)

    def read():
        answer = next(lags)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watcher = BacklogWatcher(read, health)
    health.query_started(0)
    with caplog.at_level(logging.INFO, logger="queueplane.worker"):
        watcher.read_now()
        watcher.watch_batches(30)
        assert [r for r in caplog.records if r.name == "queueplane.worker"] == []
        for now in (31, 32, 33, 34, 35, 36, 37, 38):  # stopped on, through a failed read and an empty backlog
            watcher.read_now()
            watcher.watch_batches(now)
        health.batch_handled(40, waiting=300, handled=10)
        watcher.watch_batches(41)
        watcher.watch_batches(42)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "queueplane.worker"]
    lines = [line for line in lines if "backlog read" not in line[1]]  # the outage's own lines
    assert lines == [
        (
            "ERROR",
            "brew-orders: 500 records wait and no micro-batch has ended for 31s (bound 30s): batches have stopped",
        ),
        ("INFO", "brew-orders: micro-batches end again, after 40s without one"),
    ]
