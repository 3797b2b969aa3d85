"""Every Kafka client queueplane makes, built in one place.

Commands, runtimes and tools pass the cluster's librdkafka settings (a ``KafkaTarget``'s, or
the dict an executor received as JSON) and their own role's settings; what every client
shares is set here once: where librdkafka's log lines go and what happens to the errors it
reports outside a request (``error_cb``, counted in ``ERRORS``). Anything that must change for all clients at once
(a metric of client errors, a stricter log level) changes here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient

from queueplane.kafka.target import KafkaTarget

LOGGER_NAME = "queueplane.librdkafka"
# How long a thread that serves a producer's callbacks waits in one poll. A poll returns as soon
# as a callback is due, so this only bounds how soon the thread sees that it should stop; a short
# wait woke every idle worker's threads many times a second for nothing.
SERVE_POLL_S = 0.5
log = logging.getLogger("queueplane.kafka")


def quiet_logger() -> logging.Logger:
    """librdkafka logs connection failures to stderr; route them to a logger users don't see by default."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


class ClientErrors:
    """The errors librdkafka reports outside a request (``error_cb``), counted by name.

    A command reports the failure of its own request in one line, so there they stay in the
    debug log. A worker cannot: a broker away, credentials refused or a connection reset would
    otherwise leave it idle and quiet, so it calls ``report_errors()`` and each kind of error
    gets a warning line, at most one a minute per kind with the count since, and a count the
    worker's metrics and summary show.
    """

    EVERY_S = 60.0

    def __init__(self) -> None:
        self.level = logging.DEBUG
        self._counts: Counter[str] = Counter()
        self._logged: dict[str, tuple[float, int]] = {}  # name -> (when logged, count then)
        self._last: dict[str, str] = {}  # name -> the latest error's text
        self._lock = threading.Lock()

    def __call__(self, error: KafkaError) -> None:
        name = error.name() or str(error.code())
        now = time.monotonic()
        with self._lock:
            self._counts[name] += 1
            self._last[name] = error.str()
            count = self._counts[name]
            when, then = self._logged.get(name, (-self.EVERY_S, 0))
            if now - when < self.EVERY_S:
                return
            self._logged[name] = (now, count)
        more = f" ({count - then} of them since the last line)" if count - then > 1 else ""
        log.log(self.level, "kafka client error %s: %s%s", name, error.str(), more)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def latest(self, name: str) -> tuple[int, str | None]:
        """How many errors ``name`` there were so far, and the latest one's text."""
        with self._lock:
            return self._counts[name], self._last.get(name)


ERRORS = ClientErrors()


def report_errors() -> None:
    """This process is a worker: client errors are warnings, not debug lines (``ClientErrors``)."""
    ERRORS.level = logging.WARNING


# librdkafka's own bounds of ``message.max.bytes``: its default, and the most it takes.
CLIENT_MAX_MESSAGE_BYTES = 1_000_000
CLIENT_MAX_MESSAGE_BYTES_CEILING = 1_000_000_000


def sized_for(settings: Mapping[str, Any], largest_record: int | None) -> dict[str, Any]:
    """The cluster's settings for clients that write records as large as their topics take.

    librdkafka refuses a record larger than its ``message.max.bytes`` (1 MB unless raised)
    before sending it, whatever the topic's ``max.message.bytes`` says: a topic raised to take
    bigger records would have its worker refuse them on its own, on every delivery. Raised to
    ``largest_record`` (the largest ``max.message.bytes`` among the topics a worker writes), the
    client sends what any of those topics may take, and the broker judges each record against
    its own topic: a refusal then names that record, for the runtime to dead-letter or park.
    Consumers built from the same settings take it as their largest request, and librdkafka
    raises their fetch limits to match.
    """
    wanted = max(int(settings.get("message.max.bytes", CLIENT_MAX_MESSAGE_BYTES)), largest_record or 0)
    if wanted <= CLIENT_MAX_MESSAGE_BYTES:
        return dict(settings)
    return {**settings, "message.max.bytes": min(wanted, CLIENT_MAX_MESSAGE_BYTES_CEILING)}


def client_config(settings: Mapping[str, Any], role: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The cluster's settings, then the role's, then what every client shares."""
    return {**settings, **(role or {}), "logger": quiet_logger(), "error_cb": ERRORS}


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
