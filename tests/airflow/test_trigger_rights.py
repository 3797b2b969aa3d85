"""Trigger rights are not platform rights: a queue's DAG offers only closed choices of its team's,
and a run that tries to pass cluster values or spark-submit settings is refused by real Airflow.

Runs with dag.test() against the real local broker: validate and plan talk to it, the applies
are skipped by the dry run, and the deploy task decides.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk.exceptions import ParamValidationError
from airflow_support import kafka_connection
from helpers import tagged_examples, unique_tag

from queueplane.operators.dag_factory import queue_dags

pytestmark = pytest.mark.kafka

COFFEE = "queue__cafe__coffee-orders"


@pytest.fixture
def specs(tmp_path: Path, kafka, airflow_db, monkeypatch) -> dict[str, Path]:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", kafka_connection(kafka))
    monkeypatch.delenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", raising=False)
    return tagged_examples(tmp_path / "specs", unique_tag())


def _closed(schema: dict[str, Any]) -> bool:
    """A param whose every accepted value is a choice a team may make: a switch, a bounded number, a listed word."""
    kind = schema.get("type")
    if kind == "boolean":
        return True
    if kind == "integer":
        return "minimum" in schema and "maximum" in schema
    if kind == "string":
        return "enum" in schema
    return False  # an object, an array, or anything at all


def _states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def test_the_trigger_form_offers_only_closed_choices(specs):
    dags = queue_dags(next(iter(specs.values())).parent.parent)
    assert set(dags) == set(specs)
    for dag_id, dag in dags.items():
        assert set(dag.params) == {"dry_run", "deploy"}, dag_id
        for name in dag.params:
            schema = dag.params.get_param(name).schema
            assert _closed(schema), (dag_id, name, schema)
        # Airflow itself holds a run to the schemas: an object where a switch belongs is refused.
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError, match="Invalid input for param dry_run"):
            params["dry_run"] = {"spark": {"conf": {"spark.authenticate": "false"}}}


def test_a_run_that_passes_cluster_values_is_refused_and_nothing_is_rendered(specs, capsys):
    dag = queue_dags(specs[COFFEE].parent.parent)[COFFEE]
    attack = {"image": {"repository": "registry.example.com/other/worker", "tag": "1"}, "serviceAccount": {"name": "x"}}

    run = dag.test(run_conf={"dry_run": True, "cluster_values": attack})

    assert _states(run)["deploy"] == "failed", _states(run)
    logged = capsys.readouterr().out
    assert "the run's conf sets cluster_values, which the trigger form does not offer" in logged
    assert "Rendered release" not in logged and "registry.example.com/other/worker" not in logged


def test_a_run_that_passes_spark_submit_settings_is_refused_and_nothing_is_submitted(specs, monkeypatch, capsys):
    path = specs[COFFEE]
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["deployment"] = {"target": "spark-submit", "executor": {"cores": 1, "memory": "512m"}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    platform = {"auth_secret_file": "/etc/spark/auth.args", "kafka_config": "/etc/queueplane/kafka/{team}.properties"}
    monkeypatch.setenv("AIRFLOW_VAR_QUEUEPLANE_SPARK_SUBMIT", json.dumps(platform))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:1"}))
    dag = queue_dags(path.parent.parent)[COFFEE]
    attack = {"kafka_config": "/etc/queueplane/kafka/payments.properties", "worker_script": "/tmp/mine.py"}

    run = dag.test(run_conf={"dry_run": True, "spark_submit": attack})

    assert _states(run)["deploy"] == "failed", _states(run)
    logged = capsys.readouterr().out
    assert "the run's conf sets spark_submit, which the trigger form does not offer" in logged
    assert "Submission of cafe/coffee-orders" not in logged and "/tmp/mine.py" not in logged
