"""Airflow operators and sensors over the queueplane core (the architecture's `operators/`).

They live under `queueplane.` so that installing queueplane never puts a generic
top-level `operators` module into site-packages. Each one is a thin wrapper: the Kafka
work is in queueplane.provision, the Helm work in queueplane.deploy; hooks.py holds the
connections, dag_factory.py builds one DAG per spec.
"""

from queueplane.operators.deploy import HelmDeployOperator, QueueReadySensor
from queueplane.operators.provision import (
    ApplyGroupConfigsOperator,
    ApplyTopicsOperator,
    PlanQueueOperator,
    ValidateSpecOperator,
)

__all__ = [
    "ApplyGroupConfigsOperator",
    "ApplyTopicsOperator",
    "HelmDeployOperator",
    "PlanQueueOperator",
    "QueueReadySensor",
    "ValidateSpecOperator",
]
