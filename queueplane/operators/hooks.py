"""Airflow connections as the core's inputs: a KafkaTarget and a kubeconfig file.

`kafka_default` is read by the Apache Kafka provider's own hook: the connection's extra JSON
is the librdkafka client config (`bootstrap.servers`, `security.protocol`, `sasl.*`, ...) and
callbacks given as dotted paths (`oauth_cb`, `error_cb`, ...; only those in the provider's
`[apache_kafka] callback_allowlist`) or implied by the servers (Google Managed Kafka, Amazon
MSK IAM) are resolved as for the provider's operators, so one connection serves both.
`kubernetes_default`
follows the cncf-kubernetes provider's fields: `kube_config_path`, `kube_config` (the file's
content, YAML or JSON), `in_cluster`, `cluster_context`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from queueplane.deploy.release import KubeAccess, default_kubeconfig
from queueplane.errors import UsageError
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.model import config_value

KAFKA_CONN_ID = "kafka_default"
KUBERNETES_CONN_ID = "kubernetes_default"


class KafkaTargetHook(KafkaBaseHook):
    """The provider's Kafka hook whose client is a KafkaTarget (the provider's own hooks differ the same
    way, by ``_get_client``): the config it hands over is the provider's, callbacks resolved."""

    def _get_client(self, config: dict[str, Any]) -> KafkaTarget:
        settings = {str(k): v if callable(v) else config_value(v) for k, v in config.items()}
        return KafkaTarget(settings, f"{settings['bootstrap.servers']} (connection {self.kafka_config_id})")


def kafka_target(conn_id: str = KAFKA_CONN_ID) -> KafkaTarget:
    """The cluster an Airflow Kafka connection names; the label shows the servers, never the secrets."""
    try:
        return KafkaTargetHook(kafka_config_id=conn_id).get_conn
    except AirflowNotFoundException:
        raise UsageError(
            f"Airflow connection {conn_id!r} does not exist: create it (type kafka) with extra "
            '{"bootstrap.servers": "HOST:PORT"} plus any other librdkafka settings'
        ) from None
    except ValueError as exc:  # no bootstrap.servers, or a callback that is not allowed
        raise UsageError(
            f"Airflow connection {conn_id!r}: {exc} The extra holds the librdkafka client config, as for the "
            "Apache Kafka provider"
        ) from None


def _field(extra: dict[str, Any], name: str) -> Any:
    # Older providers stored form fields as extra__kubernetes__<name>.
    value = extra.get(name)
    return value if value not in (None, "") else extra.get(f"extra__kubernetes__{name}") or None


@contextmanager
def kube_access(conn_id: str = KUBERNETES_CONN_ID) -> Iterator[KubeAccess | None]:
    """The connection's cluster access, or None when the connection does not exist.

    An inline kubeconfig is written to a private temporary file that lives as long as the
    block, since helm only reads kubeconfigs from files.
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        yield None
        return
    extra: dict[str, Any] = conn.extra_dejson
    context = _field(extra, "cluster_context")
    if str(_field(extra, "in_cluster") or "").lower() in ("true", "1"):
        yield KubeAccess(None, context, True)
        return
    inline = _field(extra, "kube_config")
    if inline:
        text = inline if isinstance(inline, str) else json.dumps(inline)
        with tempfile.TemporaryDirectory(prefix="queueplane-kube-") as tmp:
            path = os.path.join(tmp, "config")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(path, 0o600)
            yield KubeAccess(path, context, False)
        return
    path = _field(extra, "kube_config_path") or default_kubeconfig()
    yield KubeAccess(str(path), context, False)
