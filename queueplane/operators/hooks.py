"""Airflow connections as the core's inputs: a KafkaTarget and a kubeconfig file.

`kafka_default` is read by the Apache Kafka provider's own hook: the connection's extra JSON
is the librdkafka client config (`bootstrap.servers`, `security.protocol`, `sasl.*`, ...) and
callbacks given as dotted paths (`oauth_cb`, `error_cb`, ...; only those in the provider's
`[apache_kafka] callback_allowlist`) or implied by the servers (Google Managed Kafka, Amazon
MSK IAM) are resolved as for the provider's operators, so one connection serves both.
`kubernetes_default` is read by the cncf-kubernetes provider's KubernetesHook: its fields for
helm, its client for the readiness check.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from queueplane.deploy.kube_access import KubeAccess, default_kubeconfig
from queueplane.errors import UsageError
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.model import config_value

KAFKA_CONN_ID = "kafka_default"
KUBERNETES_CONN_ID = "kubernetes_default"
SPARK_CONN_ID = "spark_default"  # the spark-submit target's master, read by the Spark provider's hook


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


def kubernetes_hook(conn_id: str = KUBERNETES_CONN_ID) -> KubernetesHook | None:
    """The cncf-kubernetes provider's hook for the connection, or None when there is no such connection.

    The provider's hook would fall back to whatever cluster the Airflow worker can reach; a
    deploy without a connection is skipped instead, so no release lands on a cluster by accident.
    """
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    return KubernetesHook(conn_id=conn_id)


@contextmanager
def kube_access(hook: KubernetesHook) -> Iterator[KubeAccess]:
    """The hook's cluster as helm takes it: a kubeconfig file (and context), or the pod's own account.

    The fields are the hook's (``kube_config_path``, ``kube_config`` with the file's content,
    ``in_cluster``, ``cluster_context``). An inline kubeconfig is written to a private temporary
    file that lives as long as the block, since helm only reads kubeconfigs from files.
    """
    context = hook._get_field("cluster_context")
    if str(hook._get_field("in_cluster") or "").lower() in ("true", "1"):
        yield KubeAccess(None, context, True)
        return
    inline = hook._get_field("kube_config")
    if inline:
        text = inline if isinstance(inline, str) else json.dumps(inline)
        with tempfile.TemporaryDirectory(prefix="queueplane-kube-") as tmp:
            path = os.path.join(tmp, "config")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(path, 0o600)
            yield KubeAccess(path, context, False)
        return
    path = hook._get_field("kube_config_path") or default_kubeconfig()
    yield KubeAccess(str(path), context, False)
