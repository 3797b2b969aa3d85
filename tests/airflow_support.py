"""Connections for the Airflow tests."""

from __future__ import annotations

import json

from queueplane.kafka.target import KafkaTarget


def kafka_connection(kafka: KafkaTarget) -> str:
    """kafka_default as the Apache Kafka provider keeps it: the librdkafka config in the extra JSON."""
    return json.dumps({"conn_type": "kafka", "extra": dict(kafka.settings)})
