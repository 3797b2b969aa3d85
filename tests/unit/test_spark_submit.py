"""What the spark-submit target submits for a spec, and the settings it takes from the platform alone."""

from __future__ import annotations

import pytest
from specs_factory import dump, set_path, spec

from queueplane.deploy.spark_submit import PYTHON_RUNNER, SubmitSettings, submission
from queueplane.errors import UsageError
from queueplane.kafka.target import KafkaTarget
from queueplane.spec.rules import check_text

PLAIN = KafkaTarget({"bootstrap.servers": "kafka-1:9092"}, "kafka-1:9092")
SECURED = KafkaTarget(
    {"bootstrap.servers": "kafka-1:9093", "security.protocol": "SASL_SSL", "sasl.password": "s3cret"}, "kafka-1:9093"
)
AUTH = "/etc/spark/queueplane-auth.args"
VARIABLE = "Airflow Variable queueplane_spark_submit"


def _settings(**settings) -> SubmitSettings:
    return SubmitSettings.from_variable({"auth_secret_file": AUTH, **settings}, VARIABLE)


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
    plan = submission(queue, PLAIN, _settings(conf={"spark.pyspark.python": "/opt/py/bin/python"}))
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
    queue = _queue(tmp_path)  # team kitchen
    with pytest.raises(UsageError, match=r"sasl\.password, security\.protocol.*file for team kitchen.*kafka_config"):
        submission(queue, SECURED, _settings())
    plan = submission(queue, SECURED, _settings(kafka_config={"kitchen": "/etc/queueplane/kafka/kitchen.properties"}))
    assert plan.env["QUEUEPLANE_KAFKA_CONFIG"] == "/etc/queueplane/kafka/kitchen.properties"
    assert "QUEUEPLANE_BOOTSTRAP_SERVERS" not in plan.env
    assert "s3cret" not in " ".join([*plan.command("spark://m:7077"), *plan.env.values()])
    templated = submission(queue, SECURED, _settings(kafka_config="/etc/queueplane/kafka/{team}.properties"))
    assert templated.env["QUEUEPLANE_KAFKA_CONFIG"] == "/etc/queueplane/kafka/kitchen.properties"


def test_each_team_gets_only_the_kafka_file_the_platform_assigned_to_it(tmp_path):
    queue = _queue(tmp_path)  # team kitchen
    other = {"payments": "/etc/queueplane/kafka/payments.properties"}
    with pytest.raises(UsageError, match=r"/kafka_config must map each team"):
        _settings(kafka_config=["/etc/k"])
    with pytest.raises(UsageError, match=r"'/etc/queueplane/kafka\.properties' names one file for every team"):
        _settings(kafka_config="/etc/queueplane/kafka.properties")
    with pytest.raises(UsageError, match=r"/kafka_config/kitchen: '/etc/kafka/\.\./payments\.properties' is not an"):
        _settings(kafka_config={"kitchen": "/etc/kafka/../payments.properties"})
    shared = {"payments": "/etc/kafka/p.properties", "kitchen": "/etc/kafka/p.properties"}
    with pytest.raises(UsageError, match=r"/kafka_config/kitchen: /etc/kafka/p\.properties is assigned to team paym"):
        _settings(kafka_config=shared)
    # No file of its own: a secured cluster is refused, rather than handing over another team's.
    with pytest.raises(UsageError, match="file for team kitchen"):
        submission(queue, SECURED, _settings(kafka_config=other))
    # Another team's file named anywhere else in the settings is refused too.
    for where, settings in (
        ("/conf/spark.files", {"kafka_config": other, "conf": {"spark.files": other["payments"]}}),
        ("/conf/spark.files", {"kafka_config": "/k/{team}.p", "conf": {"spark.files": "/k/payments.p,/k/kitchen.p"}}),
        ("/checkpoint_dir", {"kafka_config": "/k/{team}.p", "checkpoint_dir": "/k/payments.p"}),
    ):
        with pytest.raises(UsageError, match=f"{where} names the Kafka properties file of team payments, which"):
            submission(queue, PLAIN, _settings(**settings))
    own = _settings(kafka_config="/k/{team}.p", conf={"spark.files": "/k/kitchen.p"})
    assert submission(queue, PLAIN, own).env["QUEUEPLANE_KAFKA_CONFIG"] == "/k/kitchen.p"


def test_every_submission_authenticates_and_encrypts_spark_rpc_with_the_platforms_secret_file(tmp_path):
    queue = _queue(tmp_path)
    with pytest.raises(UsageError, match=rf"{VARIABLE}: /auth_secret_file is not set.*RPC authentication on"):
        submission(queue, PLAIN, SubmitSettings.from_variable({}, VARIABLE))
    plan = submission(queue, PLAIN, _settings(conf={"spark.driver.extraJavaOptions": "-XX:+UseG1GC"}))
    assert plan.conf["spark.authenticate"] == "true"
    assert plan.conf["spark.network.crypto.enabled"] == "true"
    # A standalone driver reads spark.authenticate.secret alone: from the platform's Java argument file.
    assert plan.conf["spark.driver.extraJavaOptions"] == f"@{AUTH} -XX:+UseG1GC"
    assert plan.env["SPARK_SUBMIT_OPTS"] == f"@{AUTH}", "the submitting client authenticates with it too"
    assert not [k for k in plan.conf if k.startswith("spark.authenticate.secret")], "no secret in the submission"


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("spark.authenticate", "false", "Spark RPC authentication is the platform's"),
        ("spark.network.crypto.enabled", "false", "Spark RPC encryption is the platform's"),
        ("spark.authenticate.enableSaslEncryption", "false", "Spark RPC authentication"),
        ("spark.ssl.enabled", "false", "Spark's TLS settings"),
        ("spark.driver.extraJavaOptions", "-Dspark.authenticate=false", "Java options may not hold '-Dspark.'"),
        ("spark.driver.extraJavaOptions", "@/etc/other.args", "Java options may not hold '@'"),
        ("spark.executorEnv.QUEUEPLANE_KAFKA_CONFIG", "/etc/payments.properties", "the worker.s Kafka properties file"),
        ("spark.authenticate.secret", "x", "credentials never go into Spark settings"),
    ],
)
def test_the_platforms_conf_may_not_switch_authentication_or_encryption_off(tmp_path, key, value, why):
    with pytest.raises(UsageError, match=rf"{VARIABLE}: /conf/{key}: refused: {why}"):
        _settings(conf={key: value})


def test_settings_refuse_unknown_keys_and_paths_that_are_not_plain_absolute_ones():
    with pytest.raises(UsageError, match=rf"{VARIABLE}: unknown key\(s\) sparkConf"):
        SubmitSettings.from_variable({"sparkConf": {}}, VARIABLE)
    with pytest.raises(UsageError, match=rf"{VARIABLE}: /conf must be an object"):
        SubmitSettings.from_variable({"conf": "spark.authenticate=false"}, VARIABLE)
    for name in ("auth_secret_file", "worker_script", "spark_home"):
        with pytest.raises(UsageError, match=rf"{VARIABLE}: /{name}: 'relative/x' is not an absolute"):
            SubmitSettings.from_variable({name: "relative/x"}, VARIABLE)
    settings = _settings(conf={"spark.pyspark.python": "/py"}, metrics_port=9500)
    assert settings.conf == {"spark.pyspark.python": "/py"}
    assert (settings.metrics_port, settings.auth_secret_file) == (9500, AUTH)


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
