"""Render and deploy a queue's worker with Helm, and wait until it keeps up.

Rendering always runs (and validates every object), so a run without a cluster still
proves the chart and the spec fit together; only the `helm upgrade` needs the Kubernetes
connection. Without one the task ends skipped, not failed: provisioning Kafka alone is a
valid use, and the log shows the manifests that would have been applied.

Cluster values are the platform's: the Airflow Variable ``queueplane_cluster_values`` and nothing
else. Whoever may trigger a queue's DAG chooses only what its trigger form offers; a run whose
conf carries anything else is refused before anything is rendered.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.sdk import BaseOperator, BaseSensorOperator, Variable
from airflow.sdk.exceptions import AirflowSkipException

from queueplane.deploy import release
from queueplane.deploy.cluster_values import AIRFLOW_VARIABLE, checked
from queueplane.deploy.release import HELM_TIMEOUT_S
from queueplane.errors import UsageError
from queueplane.operators.hooks import KAFKA_CONN_ID, KUBERNETES_CONN_ID, kafka_target, kube_access, kubernetes_hook
from queueplane.operators.provision import switched_on, task_errors
from queueplane.provision import steps
from queueplane.spec.model import QueueSpec


def refuse_unoffered_choices(context: Mapping[str, Any], offered: Collection[str] | None) -> None:
    """UsageError when the run's conf sets anything but the trigger form's ``offered`` params.

    ``offered`` None: the task is not a queue DAG's with a trigger form, and nothing is checked.
    """
    if offered is None:
        return
    dag_run = context.get("dag_run")
    conf = getattr(dag_run, "conf", None) or {}
    unoffered = sorted(set(conf) - set(offered))
    if unoffered:
        raise UsageError(
            f"the run's conf sets {', '.join(unoffered)}, which the trigger form does not offer (it offers "
            f"{', '.join(sorted(offered))}): cluster values and spark-submit settings are the platform's, kept in "
            "the Airflow Variables queueplane_cluster_values and queueplane_spark_submit, and a run cannot change them"
        )


class HelmDeployOperator(BaseOperator):
    """`helm upgrade --install --rollback-on-failure --wait` (Helm 4's --atomic) of the release of the
    queue's worker application: its own spec and ``application_specs``, the other specs of that
    application (the DAG factory finds them), since the release runs exactly the queues it is given.
    """

    template_fields: Sequence[str] = ("kubernetes_conn_id", "deploy", "dry_run_switch")
    ui_color = "#e6f4ea"

    def __init__(
        self,
        *,
        spec_path: str,
        application_specs: Sequence[str] = (),
        kubernetes_conn_id: str = KUBERNETES_CONN_ID,
        deploy: bool | str = True,
        dry_run: bool | str = False,
        cluster_values_variable: str = AIRFLOW_VARIABLE,
        helm_timeout_s: int = HELM_TIMEOUT_S,
        run_choices: Collection[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run_choices = None if run_choices is None else tuple(run_choices)
        self.cluster_values_variable = cluster_values_variable
        self.spec_path = spec_path
        self.application_specs = list(application_specs)
        self.kubernetes_conn_id = kubernetes_conn_id
        self.deploy = deploy
        self.dry_run_switch = dry_run
        self.helm_timeout_s = helm_timeout_s

    def execute(self, context: Any) -> dict[str, str]:
        with task_errors():
            refuse_unoffered_choices(context, self.run_choices)
        if not switched_on(self.deploy):
            raise AirflowSkipException("deploy is off for this run (param deploy): nothing rendered or deployed")
        from queueplane.deploy.render import render

        with task_errors(), tempfile.TemporaryDirectory(prefix="queueplane-render-") as out:
            queues = steps.validate([self.spec_path, *self.application_specs])
            rendered = render(queues, output_dir=Path(out), overrides=self._cluster_values())
            self.log.info(
                "Rendered release %s (namespace %s, chart %s): %d object(s), all valid.\n%s",
                rendered.release,
                rendered.namespace,
                rendered.chart,
                len(rendered.objects),
                rendered.manifests,
            )
            if switched_on(self.dry_run_switch):
                raise AirflowSkipException(f"dry run: release {rendered.release} rendered and validated, not deployed")
            hook = kubernetes_hook(self.kubernetes_conn_id)
            if hook is None:
                raise AirflowSkipException(
                    f"no Airflow connection {self.kubernetes_conn_id!r}: release {rendered.release} was rendered "
                    "and validated (manifests above) but not deployed. Create the connection (type kubernetes, "
                    "with a kubeconfig path or content, or in-cluster) to deploy."
                )
            with kube_access(hook) as access:
                output = release.upgrade(self.spec_path, rendered, access, self.helm_timeout_s)
                self.log.info("helm upgrade --install %s:\n%s", rendered.release, output)
        return {"release": rendered.release, "namespace": rendered.namespace}

    def _cluster_values(self) -> dict[str, Any]:
        """The platform's Variable: the cluster values of every release, and the only ones."""
        shared = Variable.get(self.cluster_values_variable, default=None, deserialize_json=True)
        return checked(shared, f"Airflow Variable {self.cluster_values_variable}")


class QueueLagSensor(BaseSensorOperator):
    """Base of the readiness sensors: the worker runs (each target asks its own cluster) and keeps up.

    Keeping up: the age of the oldest record the group has not finished (see
    queueplane.ops.backlog_age) is within `autoscaling.targetLagSeconds`. Runs in reschedule
    mode: between checks the task gives its worker slot back.
    """

    def __init__(
        self,
        *,
        spec_path: str,
        kafka_conn_id: str = KAFKA_CONN_ID,
        poke_interval: timedelta | float = 30,
        timeout: timedelta | float = timedelta(minutes=30),
        mode: str = "reschedule",
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, mode=mode, **kwargs)
        self.spec_path = spec_path
        self.kafka_conn_id = kafka_conn_id

    def keeps_up(self, queue: QueueSpec) -> bool:
        from queueplane.ops.backlog_age import oldest_waiting_seconds

        age = oldest_waiting_seconds(kafka_target(self.kafka_conn_id), queue)
        target = queue.target_lag_seconds
        self.log.info("oldest unfinished record: %s (target %ds)", "unknown" if age is None else f"{age:.1f}s", target)
        return age is not None and age <= target


class QueueReadySensor(QueueLagSensor):
    """Waits until the worker's Deployment is available and the queue keeps up."""

    template_fields: Sequence[str] = ("kafka_conn_id", "kubernetes_conn_id")

    def __init__(self, *, kubernetes_conn_id: str = KUBERNETES_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kubernetes_conn_id = kubernetes_conn_id

    def poke(self, context: Any) -> bool:
        from queueplane.deploy.render import render

        with task_errors(), tempfile.TemporaryDirectory(prefix="queueplane-render-") as out:
            (queue,) = steps.validate([self.spec_path])
            rendered = render(queue, output_dir=Path(out))
            name = release.worker_deployment(rendered.objects)
            hook = kubernetes_hook(self.kubernetes_conn_id)
            if hook is None:
                raise AirflowSkipException(f"no connection {self.kubernetes_conn_id!r}: no worker to wait for")
            current = _deployment_status(hook, name, rendered.namespace)
            ready, status = release.deployment_verdict(rendered.namespace, name, current)
            self.log.info(status)
            if not ready:
                return False
            return self.keeps_up(queue)


def _deployment_status(hook: KubernetesHook, name: str, namespace: str) -> Any:
    """The Deployment's status through the provider's hook, or None while it does not exist."""
    from kubernetes.client import ApiException

    try:
        return hook.get_deployment_status(name, namespace).status
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
