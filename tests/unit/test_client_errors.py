"""Kafka client errors outside a request: counted by name, logged as warnings by workers, a line a minute."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError

from queueplane.kafka.clients import ClientErrors


def test_errors_are_counted_by_name_and_each_kind_logged_at_most_once_a_minute(caplog):
    errors = ClientErrors()
    errors.level = logging.WARNING
    caplog.set_level(logging.DEBUG, logger="queueplane.kafka")
    for _ in range(5):
        errors(KafkaError(KafkaError._TRANSPORT, "connection reset"))
    errors(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication failed"))
    assert errors.counts() == {"_TRANSPORT": 5, "_AUTHENTICATION": 1}
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.WARNING, "kafka client error _TRANSPORT: connection reset"),
        (logging.WARNING, "kafka client error _AUTHENTICATION: SASL authentication failed"),
    ]

    errors.EVERY_S = 0.0  # a minute later
    errors(KafkaError(KafkaError._TRANSPORT, "connection reset"))
    assert caplog.records[-1].getMessage() == (
        "kafka client error _TRANSPORT: connection reset (5 of them since the last line)"
    )


def test_a_command_keeps_them_in_the_debug_log(caplog):
    errors = ClientErrors()
    caplog.set_level(logging.DEBUG, logger="queueplane.kafka")
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "all brokers down"))
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_the_workers_metrics_show_the_counts_and_the_time_kafka_did_not_answer_at_each_scrape():
    from prometheus_client import generate_latest

    from queueplane.run.driver.metrics import WorkerMetrics

    counts = {"_TRANSPORT": 3}
    unanswered = [0.0]
    metrics = WorkerMetrics("q")
    metrics.watch_kafka(lambda: counts, lambda: unanswered[0])
    counts["_ALL_BROKERS_DOWN"], unanswered[0] = 1, 21.5  # read when scraped, not when registered
    text = generate_latest(metrics.registry).decode()
    assert 'queueplane_kafka_client_errors_total{error="_TRANSPORT",queue="q"} 3.0' in text
    assert 'queueplane_kafka_client_errors_total{error="_ALL_BROKERS_DOWN",queue="q"} 1.0' in text
    assert 'queueplane_kafka_unanswered_seconds_total{queue="q"} 21.5' in text


def test_the_queues_of_one_application_share_a_registry_each_under_its_own_name():
    from prometheus_client import CollectorRegistry, generate_latest

    from queueplane.run.driver.metrics import WorkerMetrics

    registry = CollectorRegistry()
    orders, refunds = WorkerMetrics("orders", registry), WorkerMetrics("refunds", registry)
    errors = {"_TRANSPORT": 2}
    orders.watch_kafka(lambda: errors, lambda: 0.0)
    refunds.watch_kafka(lambda: errors, lambda: 7.0)
    orders.set_removed_unread(3)
    text = generate_latest(registry).decode()
    assert 'queueplane_records_total{outcome="dlq",queue="orders"} 0.0' in text
    assert 'queueplane_records_total{outcome="dlq",queue="refunds"} 0.0' in text
    assert 'queueplane_records_removed_unread{queue="orders"} 3.0' in text
    assert 'queueplane_records_removed_unread{queue="refunds"}' not in text
    assert 'queueplane_kafka_unanswered_seconds_total{queue="refunds"} 7.0' in text
    assert text.count("# TYPE queueplane_kafka_client_errors_total counter") == 1
