"""kafka_default read by the Apache Kafka provider's hook: what works for its operators works for queueplane."""

from __future__ import annotations

import json
import time

import pytest

from queueplane.errors import UsageError
from queueplane.kafka import clients
from queueplane.operators.hooks import kafka_target

CALLBACK = "connection_callbacks.token"


def _connection(monkeypatch, extra: dict) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": extra}))


@pytest.mark.kafka
def test_the_connections_extra_is_the_client_config(airflow_db, monkeypatch, kafka):
    _connection(monkeypatch, {"bootstrap.servers": kafka.bootstrap, "client.id": "airflow-queueplane"})
    target = kafka_target()
    assert target.settings == {"bootstrap.servers": kafka.bootstrap, "client.id": "airflow-queueplane"}
    assert target.label == f"{kafka.bootstrap} (connection kafka_default)"
    assert clients.admin(target).list_topics(timeout=10).brokers, "the broker answers through the connection"


def test_an_allowed_oauth_callback_by_dotted_path_is_what_librdkafka_calls(airflow_db, monkeypatch, tmp_path):
    log = tmp_path / "oauth.log"
    monkeypatch.setenv("QUEUEPLANE_TEST_OAUTH_LOG", str(log))
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", CALLBACK)
    extra = {
        "bootstrap.servers": "127.0.0.1:1",  # never reached: the token comes first
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "OAUTHBEARER",
        "sasl.oauthbearer.config": "scope=queues",
        "oauth_cb": CALLBACK,
    }
    _connection(monkeypatch, extra)
    target = kafka_target()
    assert callable(target.settings["oauth_cb"])
    admin = clients.admin(target)
    admin.poll(0)
    deadline = time.monotonic() + 10
    while not log.exists() and time.monotonic() < deadline:
        admin.poll(0.2)
    assert log.read_text().splitlines() == ["scope=queues"], "librdkafka asked the connection's callback"


def test_a_callback_not_allowed_and_a_missing_server_are_one_clear_line(airflow_db, monkeypatch):
    monkeypatch.delenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", raising=False)
    _connection(monkeypatch, {"bootstrap.servers": "127.0.0.1:9092", "oauth_cb": CALLBACK})
    with pytest.raises(UsageError, match=r"connection 'kafka_default': Refusing to resolve Kafka callback oauth_cb"):
        kafka_target()
    _connection(monkeypatch, {"client.id": "x"})
    with pytest.raises(UsageError, match=r"connection 'kafka_default': config\['bootstrap.servers'\] must be provided"):
        kafka_target()
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT")
    with pytest.raises(UsageError, match="connection 'kafka_default' does not exist"):
        kafka_target()
