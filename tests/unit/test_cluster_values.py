"""No value, from any source, switches Spark's RPC security off, mounts a host path or names credentials.

The same Spark settings are refused by queueplane's cluster values (``--values``, ``--set``, the
Airflow Variable), by the chart's values schema (helm on its own) and by the chart's templates
(helm with ``--skip-schema-validation``); and the chart's own Spark settings win over any the
values add.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from queueplane.deploy import cluster_values, spark_conf
from queueplane.deploy.helm import HelmError, run_helm
from queueplane.deploy.render import chart_path
from queueplane.errors import UsageError

REFUSED = [
    ("spark.authenticate", "false"),
    ("spark.Authenticate", "false"),
    ("spark.network.crypto.enabled", "false"),
    ("spark.network.crypto.saslFallback", "true"),
    ("spark.network.sasl.serverAlwaysEncrypt", "false"),
    ("spark.io.encryption.enabled", "false"),
    ("spark.ssl.enabled", "false"),
    ("spark.kubernetes.executor.volumes.hostPath.host.mount.path", "/host"),
    ("spark.kubernetes.driver.volumes.hostPath.host.options.path", "/"),
    ("spark.kubernetes.executor.podTemplateFile", "/etc/other-template.yaml"),
    ("spark.kubernetes.authenticate.driver.serviceAccountName", "cluster-admin"),
    ("spark.executorEnv.QUEUEPLANE_KAFKA_CONFIG", "/etc/queueplane/kafka/payments.properties"),
    ("spark.kubernetes.driverEnv.QUEUEPLANE_KAFKA_CONFIG", "/etc/queueplane/kafka/payments.properties"),
    ("spark.executorEnv.JAVA_TOOL_OPTIONS", "-Dspark.authenticate=false"),
    ("spark.driver.extraJavaOptions", "-Dspark.authenticate=false"),
    ("spark.executor.extraJavaOptions", "-XX:+UseG1GC @/etc/other.args"),
    ("spark.driver.extraJavaOptions", "-Djava.security.auth.login.config=/etc/payments.jaas"),
    ("spark.driver.extraJavaOptions", '-D"spark.authenticate"=false'),
]
ALLOWED = [
    ("spark.sql.shuffle.partitions", "12"),
    ("spark.executor.extraJavaOptions", "-XX:+UseG1GC -Xss4m"),
    ("spark.kubernetes.executor.volumes.emptyDir.scratch.mount.path", "/scratch"),
    ("spark.executorEnv.TZ", "UTC"),
]


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [f"{key}={value}" for key, value in cases]


def _helm_set(key: str) -> str:
    return key.replace(".", "\\.")  # helm's --set reads dots as nesting


def _submit_args(manifests: str) -> list[str]:
    deployment = next(o for o in yaml.safe_load_all(manifests) if o and o["kind"] == "Deployment")
    (driver,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in driver["env"]}
    return shlex.split(env["PYSPARK_SUBMIT_ARGS"])


@pytest.mark.parametrize(("key", "value"), REFUSED, ids=_ids(REFUSED))
def test_cluster_values_refuse_the_setting_from_files_sets_and_the_variable(tmp_path, key, value):
    document = {"spark": {"conf": {key: value}}}
    values = tmp_path / "cluster.yaml"
    values.write_text(yaml.safe_dump(document))
    pointer = re.escape(f"/spark/conf/{key}")
    with pytest.raises(UsageError, match=rf"{values}: {pointer}: refused: .*no value may change them"):
        cluster_values.from_files([str(values)])
    with pytest.raises(UsageError, match=rf"^--set spark\.conf\..*: {pointer}: refused"):
        cluster_values.from_sets([f"spark.conf.{_helm_set(key)}={value}"])
    with pytest.raises(UsageError, match=rf"^Airflow Variable queueplane_cluster_values: {pointer}: refused"):
        cluster_values.checked(document, "Airflow Variable queueplane_cluster_values")


@pytest.mark.parametrize(("key", "value"), REFUSED, ids=_ids(REFUSED))
def test_the_charts_schema_refuses_the_setting_when_helm_runs_alone(tmp_path, key, value):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"spark": {"conf": {key: value}}}))
    named = rf"invalid propertyName '{re.escape(key)}'|{re.escape(f'/spark/conf/{key}')}': 'allOf' failed"
    with pytest.raises(HelmError, match=named):
        run_helm(["template", "q", str(chart_path()), "--values", str(values)])


@pytest.mark.parametrize(("key", "value"), REFUSED, ids=_ids(REFUSED))
def test_the_charts_templates_refuse_the_setting_without_the_schema(tmp_path, key, value):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"spark": {"conf": {key: value}}}))
    with pytest.raises(HelmError, match=re.escape(f"spark.conf.{key} is refused")):
        run_helm(["template", "q", str(chart_path()), "--skip-schema-validation", "--values", str(values)])


@pytest.mark.parametrize(("key", "value"), ALLOWED, ids=_ids(ALLOWED))
def test_ordinary_settings_pass_everywhere(tmp_path, key, value):
    document = {"spark": {"conf": {key: value}}}
    assert cluster_values.checked(document, "v") == document
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(document))
    rendered = run_helm(["template", "q", str(chart_path()), "--values", str(values)]).stdout
    assert f"{key}={value}" in _submit_args(rendered)


def test_the_charts_own_spark_settings_win_over_the_values(tmp_path):
    """The chart's settings (authentication, encryption, namespace, pod template, UI kill) go last."""
    overrides = {
        "spark.kubernetes.namespace": "kube-system",
        "spark.ui.killEnabled": "true",
        "spark.kubernetes.container.image.pullPolicy": "Always",
    }
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"spark": {"conf": overrides}}))
    args = _submit_args(run_helm(["template", "q", str(chart_path()), "-n", "team", "--values", str(values)]).stdout)
    settings = dict(a.split("=", 1) for a in args if a.startswith("spark."))
    assert settings["spark.kubernetes.namespace"] == "team"
    assert settings["spark.ui.killEnabled"] == "false"
    assert settings["spark.kubernetes.container.image.pullPolicy"] == "IfNotPresent"
    assert settings["spark.authenticate"] == "true" and settings["spark.network.crypto.enabled"] == "true"


def test_the_chart_carries_the_same_patterns_as_queueplane():
    """One rule in three places: kept equal here, so a pattern changed in one is changed in all."""
    helpers = (chart_path() / "templates" / "_helpers.tpl").read_text()
    for name, pattern in (
        ("refusedSparkKey", spark_conf.REFUSED_KEY),
        ("refusedJavaOptions", spark_conf.REFUSED_JAVA_OPTIONS),
        ("javaOptionsKey", "(?i)" + spark_conf.JAVA_OPTIONS_KEY.pattern),
    ):
        assert f'{{{{- define "queue-worker.{name}" -}}}}\n{pattern}\n{{{{- end -}}}}' in helpers, name
    schema = json.loads((chart_path() / "values.schema.json").read_text())
    conf = schema["properties"]["spark"]["properties"]["conf"]
    assert conf["propertyNames"]["not"]["pattern"] == spark_conf.REFUSED_KEY
    (java,) = conf["patternProperties"].items()
    assert java[0] == "(?i)" + spark_conf.JAVA_OPTIONS_KEY.pattern
    assert java[1]["allOf"][1] == {"not": {"pattern": spark_conf.REFUSED_JAVA_OPTIONS}}
