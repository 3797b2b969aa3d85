"""What Airflow's ProvidersManager reads about queueplane (the ``apache_airflow_provider`` entry point).

Airflow calls :func:`get_provider_info` for every installed distribution that declares the entry
point, validates the dict against its ``provider_info.schema.json`` and lists the provider (``airflow
providers list``, the UI's Providers page) under the distribution's version. ``package-name`` must be
the distribution's name. queueplane's connections are the Kafka and cncf-kubernetes providers' own
types (``kafka_default``, ``kubernetes_default``, ``spark_default``, see hooks.py), read through those providers' hooks
(its one hook class only changes what the Kafka hook builds), so it declares no ``connection-types``.
"""

from __future__ import annotations

from typing import Any

from queueplane import __version__

INTEGRATION = "queueplane"
DOCS = "https://github.com/queueplane/queueplane#readme"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "queueplane",
        "name": "queueplane",
        "description": "Kafka queues from a YAML spec: validate, plan and apply topics and group configs, "
        "deploy the queue's Spark worker with Helm or spark-submit.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": DOCS,
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "queueplane.operators.provision",
                    "queueplane.operators.deploy",
                    "queueplane.operators.spark_submit",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["queueplane.operators.deploy", "queueplane.operators.spark_submit"],
            }
        ],
        # The Kafka, Kubernetes and Spark providers' hooks, as queueplane reads their connections.
        "hooks": [{"integration-name": INTEGRATION, "python-modules": ["queueplane.operators.hooks"]}],
    }
