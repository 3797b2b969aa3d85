"""Every Kafka client queueplane makes, built in one place.

Commands, runtimes and tools pass the cluster's librdkafka settings (a ``KafkaTarget``'s, or
the dict an executor received as JSON) and their own role's settings; what every client
shares is set here once: where librdkafka's log lines go and what happens to the errors it
reports outside a request (``error_cb``). Anything that must change for all clients at once
(a metric of client errors, a stricter log level) changes here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient

from queueplane.kafka.target import KafkaTarget

LOGGER_NAME = "queueplane.librdkafka"
log = logging.getLogger("queueplane.kafka")


def quiet_logger() -> logging.Logger:
    """librdkafka logs connection failures to stderr; route them to a logger users don't see by default."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def _on_error(error: KafkaError) -> None:
    # Without a callback librdkafka prints these to stderr. A command reports the failure of
    # its own request in one line; the background error stays in the debug log.
    log.debug("kafka client error: %s", error)


def client_config(settings: Mapping[str, Any], role: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The cluster's settings, then the role's, then what every client shares."""
    return {**settings, **(role or {}), "logger": quiet_logger(), "error_cb": _on_error}


def _settings(cluster: KafkaTarget | Mapping[str, Any]) -> Mapping[str, Any]:
    return cluster.settings if isinstance(cluster, KafkaTarget) else cluster


def admin(cluster: KafkaTarget | Mapping[str, Any], role: Mapping[str, Any] | None = None) -> AdminClient:
    return AdminClient(client_config(_settings(cluster), role))


def consumer(cluster: KafkaTarget | Mapping[str, Any], role: Mapping[str, Any]) -> Consumer:
    """A consumer; ``role`` names at least its ``group.id``."""
    return Consumer(client_config(_settings(cluster), role))


def share_consumer(cluster: KafkaTarget | Mapping[str, Any], role: Mapping[str, Any]) -> ShareConsumer:
    """A KIP-932 share consumer; ``role`` names at least its ``group.id``."""
    return ShareConsumer(client_config(_settings(cluster), role))


def producer(cluster: KafkaTarget | Mapping[str, Any], role: Mapping[str, Any] | None = None) -> Producer:
    return Producer(client_config(_settings(cluster), role))
