"""What the spark-submit target submits for a spec, and the settings it takes from the platform."""

from __future__ import annotations

import pytest
from specs_factory import dump, set_path, spec

from queueplane.deploy.spark_submit import PYTHON_RUNNER, SubmitSettings, submission
from queueplane.errors import UsageError
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.rules import check_text

PLAIN = KafkaTarget({"bootstrap.servers": "kafka-1:9092"}, "kafka-1:9092")


def _queue(tmp_path, **deployment):
    doc = set_path(spec("share"), "spec/deployment", {"target": "spark-submit", **deployment})
    doc = set_path(doc, "spec/autoscaling", {"minExecutors": 2, "maxExecutors": 5})
    path = tmp_path / "brew.yaml"
    path.write_text(dump(doc))
    (queue,) = check_text(path.read_text(), str(path)).raise_if_invalid()
    return queue


def test_the_worker_is_submitted_in_cluster_mode_through_pythonrunner_within_the_specs_bounds(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "a-secret-of-the-airflow-worker")
    queue = _queue(tmp_path, executor={"cores": 2, "memory": "3g"}, driver={"memory": "2g"})
    plan = submission(queue, PLAIN, SubmitSettings(conf={"spark.pyspark.python": "/opt/py/bin/python"}))
    command = plan.command("spark://master:7077")
    assert command[command.index("--class") + 1] == PYTHON_RUNNER
    assert command[command.index("--deploy-mode") + 1] == "cluster"
    assert plan.application.endswith(".jar") and "spark-core_" in plan.application
    script, py_files, *args = plan.application_args
    assert script.endswith("queue_worker.py") and py_files == ""
    assert args[args.index("--spec") + 1] == str((tmp_path / "brew.yaml").resolve())
    assert (plan.executor_cores, plan.executor_memory, plan.driver_memory) == (2, "3g", "2g")
    assert plan.total_executor_cores == 10, "maxExecutors executors of executor.cores each"
    assert plan.conf["spark.executor.instances"] == "2", "minExecutors at start"
    assert plan.conf["spark.dynamicAllocation.enabled"] == "false", "the worker's controller scales, not Spark's"
    assert plan.conf["spark.pyspark.driver.python"] == plan.conf["spark.pyspark.python"] == "/opt/py/bin/python"
    assert plan.env["QUEUEPLANE_BOOTSTRAP_SERVERS"] == "kafka-1:9092"
    assert not any(key.startswith("AIRFLOW") for key in plan.env), "the master keeps the environment it is sent"


def test_a_properties_file_on_the_nodes_names_the_cluster_and_credentials_never_travel(tmp_path):
    queue = _queue(tmp_path)
    secured = KafkaTarget(
        {"bootstrap.servers": "kafka-1:9093", "security.protocol": "SASL_SSL", "sasl.password": "s3cret"}, "k"
    )
    with pytest.raises(UsageError, match=r"sasl\.password, security\.protocol.*kafka_config"):
        submission(queue, secured, SubmitSettings())
    plan = submission(queue, secured, SubmitSettings(kafka_config="/etc/queueplane/kafka.properties"))
    assert plan.env["QUEUEPLANE_KAFKA_CONFIG"] == "/etc/queueplane/kafka.properties"
    assert "QUEUEPLANE_BOOTSTRAP_SERVERS" not in plan.env
    assert "s3cret" not in " ".join([*plan.command("spark://m:7077"), *plan.env.values()])


def test_settings_refuse_unknown_keys_and_a_runs_values_go_over_the_platforms():
    with pytest.raises(UsageError, match=r"Airflow Variable queueplane_spark_submit: unknown key\(s\) sparkConf"):
        SubmitSettings.layered(({"sparkConf": {}}, "Airflow Variable queueplane_spark_submit"))
    platform = {"conf": {"spark.pyspark.python": "/py", "spark.eventLog.enabled": "true"}, "kafka_config": "/etc/k"}
    run = {"conf": {"spark.eventLog.enabled": "false"}, "metrics_port": 9500}
    merged = SubmitSettings.layered((platform, "v"), (run, "run"))
    assert merged.conf == {"spark.pyspark.python": "/py", "spark.eventLog.enabled": "false"}
    assert (merged.kafka_config, merged.metrics_port) == ("/etc/k", 9500)


def test_kubernetes_only_fields_are_refused_on_the_spark_submit_target():
    doc = set_path(spec("share"), "spec/deployment", {"target": "spark-submit", "namespace": "cafe", "image": "r/w:1"})
    problems = check_text(dump(doc), "specs/cafe/brew.yaml").problems
    assert {p.pointer for p in problems} == {"/spec/deployment/namespace", "/spec/deployment/image"}
    assert all("applies to target kubernetes only" in p.message for p in problems)


def test_the_helm_chart_is_not_rendered_for_a_spark_submit_queue(tmp_path):
    from queueplane.deploy.render import render

    queue = _queue(tmp_path)
    with pytest.raises(UsageError, match=r"brew\.yaml: /spec/deployment/target is spark-submit: the Helm chart"):
        render(queue, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists(), "nothing written"
