"""`deployment.target: spark-submit`: a queue's DAG submits its worker to a real Spark standalone
master through the Spark provider's hook, the driver processes records, and a redeploy stops
it and starts the next one, with nothing lost between them. The master and its worker run with
Spark RPC authentication and encryption on, as a platform's do: a submission without the
platform's secret is turned away, and the DAG's, which names it, runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from airflow.models.variable import Variable as VariableModel
from airflow.sdk.exceptions import AirflowFailException
from airflow_support import kafka_connection
from helpers import wait_for
from spark_standalone import SPARK_HOME, SPARK_SUBMIT, Standalone, free_port, start_standalone, write_auth_args
from worker_support import TestQueue as QueueFiles
from worker_support import make_queue, order, produce, read_all

from queueplane.deploy.spark_submit import PYTHON_RUNNER, StandaloneDrivers, spark_core_jar
from queueplane.operators import SparkSubmitDeployOperator
from queueplane.operators.dag_factory import SPECS_DIR_ENV, queue_dag
from queueplane.operators.spark_submit import driver_variable
from queueplane.provision import steps

pytestmark = pytest.mark.kafka

# Before the first deploy; produced just before the redeploy (in flight when the first driver is
# stopped); after it.
FIRST, ACROSS, AFTER = 200, 200, 100
TOTAL = FIRST + ACROSS + AFTER


@pytest.fixture
def auth_args(tmp_path: Path) -> Path:
    """The platform's Spark RPC secret, installed where the Airflow worker and the Spark nodes read it."""
    return write_auth_args(tmp_path / "etc" / "spark-auth.args")


@pytest.fixture
def standalone(tmp_path: Path, auth_args: Path) -> Iterator[Standalone]:
    cluster = start_standalone(tmp_path / "spark", cores=2, memory="2g", rest=True, auth_args=auth_args)
    yield cluster
    cluster.stop()


@pytest.fixture
def queue(tmp_path: Path, kafka, airflow_db, monkeypatch) -> QueueFiles:
    queue = make_queue(tmp_path, kafka, partitions=2, concurrency=2, lock="20s")
    doc = yaml.safe_load(queue.spec_path.read_text())
    doc["spec"]["deployment"] = {"target": "spark-submit", "executor": {"cores": 1, "memory": "512m"}}
    doc["spec"]["autoscaling"] = {"minExecutors": 1, "maxExecutors": 1}
    queue.spec_path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", kafka_connection(kafka))
    monkeypatch.setenv(SPECS_DIR_ENV, str(queue.folder))  # dag.test() finds the DAG in the DAG folder
    return queue


@pytest.fixture
def connected(queue: QueueFiles, standalone: Standalone, auth_args: Path, monkeypatch) -> Standalone:
    """spark_default names the master (cluster deploy mode, its REST port); the Variable the nodes' Python."""
    master_port = int(standalone.master_url.rsplit(":", 1)[1])
    spark = {
        "conn_type": "spark",
        "host": "spark://127.0.0.1",
        "port": master_port,
        "extra": {"deploy-mode": "cluster", "rest-port": standalone.rest_port},
    }
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(spark))
    # spark-submit on PATH, as on an Airflow worker that submits to Spark: pyspark's, in this venv.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    settings = {
        "conf": {"spark.pyspark.python": sys.executable},
        "metrics_port": free_port(),
        "auth_secret_file": str(auth_args),
    }
    monkeypatch.setenv("AIRFLOW_VAR_QUEUEPLANE_SPARK_SUBMIT", json.dumps(settings))
    return standalone


def _states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def _handled(queue: QueueFiles, count: int, timeout_s: float) -> set[str]:
    wait_for("records handled", lambda: len({e["id"] for e in queue.events() if e["id"]}) >= count, timeout_s)
    return {e["id"] for e in queue.events() if e["id"]}


# Heavy: a standalone master and worker, two drivers and their executors. The tests of the
# platform's Variable below start no Spark and run beside others.
@pytest.mark.heavy
def test_the_dag_submits_the_worker_to_the_master_and_a_redeploy_replaces_its_driver(
    queue: QueueFiles, kafka, connected: Standalone
):
    standalone = connected
    (spec,) = steps.validate([str(queue.spec_path)])
    dag = queue_dag(spec)
    assert isinstance(dag.get_task("deploy"), SparkSubmitDeployOperator)
    drivers = StandaloneDrivers(f"http://127.0.0.1:{standalone.rest_port}")
    first_driver = second_driver = None
    # Without the secret, the master does not take a submission at all.
    unauthenticated = subprocess.run(
        [
            *(str(SPARK_SUBMIT), "--master", standalone.master_url, "--deploy-mode", "cluster"),
            *("--class", PYTHON_RUNNER, "--conf", "spark.authenticate=true", spark_core_jar(None), "x.py", ""),
        ],
        env={"PATH": os.environ["PATH"], "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unauthenticated.returncode != 0, unauthenticated.stderr[-2000:]
    assert "A secret key must be specified" in unauthenticated.stderr, unauthenticated.stderr[-2000:]
    assert standalone.state()["activedrivers"] == [] and standalone.state()["completeddrivers"] == []
    try:
        produce(kafka, queue.topic, [order(i) for i in range(FIRST)])
        first = dag.test()
        assert first.state == "success", _states(first)
        first_driver = json.loads(VariableModel.get(driver_variable(spec)))["driver"]
        assert drivers.state(first_driver) == "RUNNING"
        # The master runs it as a supervised driver on its worker, not as a child of the task.
        active = standalone.state()["activedrivers"]
        assert [d["id"] for d in active] == [first_driver], active
        assert _handled(queue, FIRST, 240) == {f"id-{i:06d}" for i in range(FIRST)}

        produce(kafka, queue.topic, [order(FIRST + i) for i in range(ACROSS)])
        second = dag.test()  # a redeploy: the first driver is stopped, the next one submitted
        assert second.state == "success", _states(second)
        second_driver = json.loads(VariableModel.get(driver_variable(spec)))["driver"]
        assert second_driver != first_driver
        assert drivers.state(first_driver) == "KILLED"
        assert drivers.state(second_driver) == "RUNNING"
        assert [d["id"] for d in standalone.state()["activedrivers"]] == [second_driver]
        produce(kafka, queue.topic, [order(FIRST + ACROSS + i) for i in range(AFTER)])
        handled = _handled(queue, TOTAL, 240)
    finally:
        for driver in (first_driver, second_driver):
            if driver:
                drivers.stop(driver, 60)
    assert handled == {f"id-{i:06d}" for i in range(TOTAL)}, "every record handled: none lost across the redeploy"
    assert read_all(kafka, queue.dlq, timeout_s=3) == [], "every record is valid, none in the DLQ"
    # The records produced after the redeploy were handled by the second driver's executor:
    # Python processes other than the ones that handled the first records.
    early = {e["pid"] for e in queue.events() if e["id"] and int(e["id"][3:]) < FIRST}
    late = {e["pid"] for e in queue.events() if e["id"] and int(e["id"][3:]) >= FIRST + ACROSS}
    assert late and late.isdisjoint(early), (early, late)


def test_a_secured_kafka_connection_without_a_properties_file_on_the_nodes_is_refused(
    queue: QueueFiles, kafka, monkeypatch
):
    """Credentials never ride on a command line or the environment the master keeps."""
    secured = {"bootstrap.servers": kafka.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": secured}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:1"}))
    monkeypatch.setenv("AIRFLOW_VAR_QUEUEPLANE_SPARK_SUBMIT", json.dumps({"auth_secret_file": "/etc/spark/auth.args"}))
    with pytest.raises(AirflowFailException, match="kafka_config of Airflow Variable queueplane_spark_submit"):
        SparkSubmitDeployOperator(task_id="deploy", spec_path=str(queue.spec_path)).execute(context={})


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({"conf": {"spark.authenticate": "false"}}, "/conf/spark.authenticate: refused"),
        ({"conf": {"spark.driver.extraJavaOptions": "-Dspark.network.crypto.enabled=false"}}, "Java options may"),
        ({}, "/auth_secret_file is not set"),
        (
            {"kafka_config": "/etc/kafka/{team}.properties", "conf": {"spark.files": "/etc/kafka/payments.properties"}},
            "/conf/spark.files names the Kafka properties file of team payments",
        ),
    ],
)
def test_the_platforms_variable_cannot_switch_authentication_off_or_hand_over_another_teams_file(
    queue: QueueFiles, monkeypatch, settings, refused
):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:1"}))
    variable = {"auth_secret_file": "/etc/spark/auth.args", **settings} if settings else {}
    monkeypatch.setenv("AIRFLOW_VAR_QUEUEPLANE_SPARK_SUBMIT", json.dumps(variable))
    with pytest.raises(AirflowFailException, match=rf"Airflow Variable queueplane_spark_submit: .*{refused}"):
        SparkSubmitDeployOperator(task_id="deploy", spec_path=str(queue.spec_path), dry_run=True).execute(context={})
