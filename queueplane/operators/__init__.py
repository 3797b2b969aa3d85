"""Airflow operators and sensors over the queueplane core (the architecture's `operators/`).

They live under `queueplane.` so that installing queueplane never puts a generic
top-level `operators` module into site-packages. Each one is a thin wrapper: the Kafka
work is in queueplane.provision, the Helm and spark-submit work in queueplane.deploy; hooks.py holds the
connections, dag_factory.py builds one DAG per spec.

The names below load on first use: Airflow imports every provider's entry point
(provider.py, in this package) whenever it starts, and that must not import the operators,
so that a queueplane that does not fit the installed Airflow breaks only its own DAGs.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {
    "ApplyGroupConfigsOperator": "queueplane.operators.provision",
    "ApplyTopicsOperator": "queueplane.operators.provision",
    "PlanQueueOperator": "queueplane.operators.provision",
    "RemoveQueuesOperator": "queueplane.operators.provision",
    "ValidateSpecOperator": "queueplane.operators.provision",
    "HelmDeployOperator": "queueplane.operators.deploy",
    "QueueReadySensor": "queueplane.operators.deploy",
    "SparkSubmitDeployOperator": "queueplane.operators.spark_submit",
    "SparkDriverReadySensor": "queueplane.operators.spark_submit",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
