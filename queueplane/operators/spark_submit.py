"""Deploy a queue's worker with spark-submit (``deployment.target: spark-submit``), and wait until it keeps up.

The submission goes through the Apache Spark provider's ``SparkSubmitHook`` with the
``spark_default`` connection (a standalone master, ``spark://HOST:PORT``), in cluster deploy
mode, so the master supervises the driver and it outlives the task. queueplane.deploy.spark_submit
says what is submitted and why. A redeploy stops the queue's running driver first (one driver
per queue, as a consumer group's offsets and a share group's drain expect), then submits the new
one; the driver's id is kept in an Airflow Variable named after the queue, so the next run,
the readiness sensor and an operator reading the UI all find it.

The submission settings are the platform's: the Airflow Variable ``queueplane_spark_submit`` and
nothing else; a run whose conf carries anything the trigger form does not offer is refused.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook, BaseOperator, Variable
from airflow.sdk.exceptions import AirflowSkipException

from queueplane.deploy.spark_submit import (
    ENDED_STATES,
    PYTHON_RUNNER,
    SETTINGS_VARIABLE,
    StandaloneDrivers,
    SubmitSettings,
    submission,
)
from queueplane.errors import DeployError, UsageError
from queueplane.operators.deploy import QueueLagSensor, refuse_unoffered_choices
from queueplane.operators.hooks import KAFKA_CONN_ID, SPARK_CONN_ID, kafka_target
from queueplane.operators.provision import switched_on, task_errors
from queueplane.provision import steps
from queueplane.spec.model import QueueSpec


def driver_variable(queue: QueueSpec) -> str:
    """The Variable holding the queue's running driver: ``{"driver": ID, "master": URL}``."""
    return f"queueplane_spark_driver__{queue.team}__{queue.name}"


def _master(conn_id: str) -> tuple[str, StandaloneDrivers]:
    """The master URL and its REST server, read from the connection as the provider's hook reads them."""
    conn = BaseHook.get_connection(conn_id)
    host = conn.host or ""
    master = host if "://" in host else f"{conn.conn_type}://{host}"
    master = f"{master}:{conn.port}" if conn.port else master
    if not master.startswith("spark://"):
        raise UsageError(
            f"Airflow connection {conn_id!r} names {master}: the spark-submit target needs a Spark "
            "standalone master (spark://HOST:PORT)"
        )
    extra = conn.extra_dejson
    hostname = master.removeprefix("spark://").rsplit(":", 1)[0]
    rest = f"{extra.get('rest-scheme', 'http')}://{hostname}:{int(extra.get('rest-port', 6066))}"
    return master, StandaloneDrivers(rest)


class SparkSubmitDeployOperator(BaseOperator):
    """Submit the queue's worker to the Spark cluster of ``spark_conn_id``; stop the one it replaces."""

    template_fields: Sequence[str] = ("spark_conn_id", "kafka_conn_id", "deploy", "dry_run_switch")
    ui_color = "#fdf0e0"

    def __init__(
        self,
        *,
        spec_path: str,
        spark_conn_id: str = SPARK_CONN_ID,
        kafka_conn_id: str = KAFKA_CONN_ID,
        deploy: bool | str = True,
        dry_run: bool | str = False,
        settings_variable: str = SETTINGS_VARIABLE,
        run_choices: Collection[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec_path = spec_path
        self.spark_conn_id = spark_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.deploy = deploy
        self.dry_run_switch = dry_run
        self.run_choices = None if run_choices is None else tuple(run_choices)
        self.settings_variable = settings_variable
        self._hook: SparkSubmitHook | None = None

    def execute(self, context: Any) -> dict[str, str]:
        with task_errors():
            refuse_unoffered_choices(context, self.run_choices)
        if not switched_on(self.deploy):
            raise AirflowSkipException("deploy is off for this run (param deploy): nothing submitted")
        with task_errors():
            (queue,) = steps.validate([self.spec_path])
            settings = self._settings()
            plan = submission(queue, kafka_target(self.kafka_conn_id), settings)
            master, drivers = _master(self.spark_conn_id)
            self.log.info("Submission of %s/%s:\n%s", queue.team, queue.name, " ".join(plan.command(master)))
            if switched_on(self.dry_run_switch):
                raise AirflowSkipException("dry run: the submission is above, nothing submitted")
            previous = Variable.get(driver_variable(queue), default=None, deserialize_json=True)
            if previous:
                stopped = drivers.stop(previous["driver"], settings.start_timeout_s)
                outcome = f"was {stopped}, killed" if stopped else "had ended"
                self.log.info("previous driver %s %s", previous["driver"], outcome)
            self._hook = SparkSubmitHook(
                conf=plan.conf,
                conn_id=self.spark_conn_id,
                java_class=PYTHON_RUNNER,
                name=plan.name,
                application_args=plan.application_args,
                executor_cores=plan.executor_cores,
                executor_memory=plan.executor_memory,
                driver_memory=plan.driver_memory,
                total_executor_cores=plan.total_executor_cores,
                deploy_mode="cluster",
            )
            driver = self._hook.submit(plan.application, env=plan.env)
            if not driver:
                raise DeployError(f"spark-submit to {master} printed no driver id")
            Variable.set(driver_variable(queue), json.dumps({"driver": driver, "master": master}))
            state = drivers.wait_for(driver, frozenset({"RUNNING"}), settings.start_timeout_s)
            if state != "RUNNING":
                raise DeployError(f"driver {driver} ended {state} on {master} before it ran; see its log on the worker")
            self.log.info("driver %s RUNNING on %s", driver, master)
        return {"driver": driver, "master": master}

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()

    def _settings(self) -> SubmitSettings:
        """The platform's Variable: the settings of every queue's submission, and the only ones."""
        shared = Variable.get(self.settings_variable, default=None, deserialize_json=True)
        return SubmitSettings.from_variable(shared, f"Airflow Variable {self.settings_variable}")


class SparkDriverReadySensor(QueueLagSensor):
    """Waits until the queue's driver runs on the master and the queue keeps up."""

    template_fields: Sequence[str] = ("kafka_conn_id", "spark_conn_id")

    def __init__(self, *, spark_conn_id: str = SPARK_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spark_conn_id = spark_conn_id

    def poke(self, context: Any) -> bool:
        with task_errors():
            (queue,) = steps.validate([self.spec_path])
            record = Variable.get(driver_variable(queue), default=None, deserialize_json=True)
            if not record:
                raise AirflowSkipException(f"no driver submitted for {queue.team}/{queue.name}")
            _, drivers = _master(self.spark_conn_id)
            state = drivers.state(record["driver"])
            self.log.info("driver %s on %s: %s", record["driver"], record["master"], state)
            if state != "RUNNING":
                if state in ENDED_STATES - {"UNKNOWN"}:  # UNKNOWN: the master is recovering
                    raise DeployError(f"driver {record['driver']} ended {state}")
                return False
            return self.keeps_up(queue)
