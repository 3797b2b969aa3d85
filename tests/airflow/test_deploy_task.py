"""The deploy task with the real render path and the real helm binary (no Kubernetes cluster here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from helpers import EXAMPLES

from queueplane.operators import HelmDeployOperator

SPEC = str(EXAMPLES / "cafe" / "coffee-orders.yaml")

NOWHERE = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "queueplane", "user": {"token": "not-a-secret"}}],
    "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "queueplane"}}],
    "current-context": "nowhere",
}


def _deploy(**kwargs) -> HelmDeployOperator:
    return HelmDeployOperator(task_id="deploy", spec_path=SPEC, **kwargs)


def test_without_a_kubernetes_connection_the_release_is_rendered_validated_logged_and_skipped(
    airflow_db, monkeypatch, capsys
):
    monkeypatch.delenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", raising=False)
    with pytest.raises(AirflowSkipException, match=r"no Airflow connection 'kubernetes_default': release coffee-"):
        _deploy().execute(context={})
    logged = capsys.readouterr().out  # Airflow's task log goes to stdout outside a worker
    assert "Rendered release coffee-orders (namespace cafe" in logged
    assert "kind: Deployment" in logged  # the manifests themselves are in the log


def test_dry_run_renders_and_skips_and_deploy_off_skips_at_once(airflow_db):
    with pytest.raises(AirflowSkipException, match="dry run: release coffee-orders rendered and validated"):
        _deploy(dry_run=True).execute(context={})
    with pytest.raises(AirflowSkipException, match="deploy is off"):
        _deploy(deploy="False").execute(context={})


def test_with_a_kubernetes_connection_helm_upgrade_runs_against_its_cluster(airflow_db, monkeypatch, tmp_path: Path):
    """The inline kubeconfig of the connection reaches helm: its (unreachable) cluster is the one helm dials."""
    connection = {"conn_type": "kubernetes", "extra": {"kube_config": yaml.safe_dump(NOWHERE)}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(connection))
    # The first helm call asks whether the release is this queue's (deploy/ownership.py).
    with pytest.raises(AirflowException, match=r"helm get metadata failed: .*127\.0\.0\.1:1"):
        _deploy(helm_timeout_s=20).execute(context={})


def test_cluster_values_come_from_the_platforms_variable(airflow_db, monkeypatch, capsys):
    monkeypatch.delenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", raising=False)
    shared = {
        "kafka": {"configSecret": {"name": "cafe-kafka"}},
        "imagePullSecrets": ["pull-secret"],
        "image": {"repository": "registry.example.com/queueplane/worker", "tag": "0.1.1-rc1"},
    }
    monkeypatch.setenv("AIRFLOW_VAR_QUEUEPLANE_CLUSTER_VALUES", json.dumps(shared))
    with pytest.raises(AirflowSkipException, match="no Airflow connection"):
        _deploy().execute(context={})
    logged = capsys.readouterr().out
    assert 'secretName: "cafe-kafka"' in logged or "secretName: cafe-kafka" in logged
    assert "- name: pull-secret" in logged or '- name: "pull-secret"' in logged
    assert "registry.example.com/queueplane/worker:0.1.1-rc1" in logged, "the platform's image pins the rollout"
    assert "QUEUEPLANE_BOOTSTRAP_SERVERS" not in logged, "a Kafka config Secret replaces the placeholder address"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("spark.authenticate", "false"),
        ("spark.network.crypto.enabled", "false"),
        ("spark.kubernetes.executor.volumes.hostPath.host.mount.path", "/host"),
    ],
)
def test_not_even_the_platforms_variable_switches_spark_rpc_security_off_or_mounts_a_host_path(
    airflow_db, monkeypatch, setting, value
):
    monkeypatch.setenv("AIRFLOW_VAR_QUEUEPLANE_CLUSTER_VALUES", json.dumps({"spark": {"conf": {setting: value}}}))
    refused = rf"Variable queueplane_cluster_values: /spark/conf/{re.escape(setting)}: refused"
    with pytest.raises(AirflowFailException, match=refused):
        _deploy(dry_run=True).execute(context={})


def test_cluster_values_cannot_change_what_the_spec_owns(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_QUEUEPLANE_CLUSTER_VALUES", json.dumps({"autoscaling": {"maxExecutors": 500}}))
    with pytest.raises(AirflowException, match=r"Variable queueplane_cluster_values: /autoscaling comes from the"):
        _deploy().execute(context={})


def test_each_queue_s_dag_deploys_its_whole_application(airflow_db, tmp_path: Path, capsys):
    """Three specs name one application: each one's DAG renders the release of all three, and a queue
    of its own application deploys alone."""
    from queueplane.operators.dag_factory import queue_dags

    coffee = yaml.safe_load(Path(SPEC).read_text())
    for name in ("espresso", "latte", "mocha", "tea"):
        doc = yaml.safe_load(Path(SPEC).read_text())
        doc["metadata"]["name"] = name
        doc["spec"]["topic"]["name"] = f"cafe.{name}.v1"
        doc["spec"]["group"]["id"] = f"{name}-workers"
        doc["spec"]["processing"]["output"]["topic"] = f"cafe.{name}.ready.v1"
        doc["spec"].pop("deadLetter", None)
        if name != "tea":
            doc["spec"]["deployment"] = {**coffee["spec"]["deployment"], "application": "coffee-bar"}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    dags = queue_dags(tmp_path)
    for name in ("espresso", "latte", "mocha"):
        deploy = dags[f"queue__cafe__{name}"].get_task("deploy")
        others = {Path(p).stem for p in deploy.application_specs}
        assert others == {"espresso", "latte", "mocha"} - {name}
    assert dags["queue__cafe__tea"].get_task("deploy").application_specs == []
    deploy = dags["queue__cafe__latte"].get_task("deploy")
    with pytest.raises(AirflowSkipException, match="dry run: release coffee-bar rendered and validated"):
        HelmDeployOperator(
            task_id="deploy", spec_path=deploy.spec_path, application_specs=deploy.application_specs, dry_run=True
        ).execute(context={})
    logged = capsys.readouterr().out
    assert all(f"name: {name}\n" in logged for name in ("espresso", "latte", "mocha")), "a Queue object for each"
