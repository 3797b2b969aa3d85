"""The driver pod owns what Spark makes for it on Kubernetes: its executors (through their pod
template) and their ConfigMap, without Spark's wait for the driver pod to be Ready."""

from __future__ import annotations

import yaml

from queueplane.deploy.render import render
from queueplane.provision import steps
from queueplane.run.spark.executor_pods import adopt_config_maps, driver_owner, owned_template

OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "coffee-orders-5677dd7d8b-4dt7j", "uid": "u-1", "controller": True}


def test_the_owner_is_the_pod_the_downward_api_names_and_none_outside_a_pod(monkeypatch):
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("QUEUEPLANE_POD_UID", raising=False)
    assert driver_owner() is None
    monkeypatch.setenv("POD_NAME", OWNER["name"])
    assert driver_owner() is None, "a pod name without its uid makes no owner reference"
    monkeypatch.setenv("QUEUEPLANE_POD_UID", "u-1")
    assert driver_owner() == OWNER


def test_the_executors_template_keeps_what_the_chart_wrote_and_gains_the_driver_as_owner(tmp_path):
    source = tmp_path / "chart" / "executor-pod-template.yaml"
    source.parent.mkdir()
    chart = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {"app.kubernetes.io/component": "executor"}, "ownerReferences": [{"name": "x"}]},
        "spec": {"containers": [{"name": "executor"}], "automountServiceAccountToken": False},
    }
    source.write_text(yaml.safe_dump(chart))
    owned = yaml.safe_load(owned_template(source, OWNER, tmp_path / "owned").read_text())
    assert owned["spec"] == chart["spec"] and owned["metadata"]["labels"] == chart["metadata"]["labels"]
    assert owned["metadata"]["ownerReferences"] == [{"name": "x"}, OWNER]
    assert yaml.safe_load(source.read_text()) == chart, "the mounted template is left as it was"


def test_the_executors_config_maps_of_this_application_are_adopted_once():
    calls: list[tuple[str, str, dict | None]] = []
    maps = [
        {"metadata": {"name": "spark-exec-a-conf-map"}},
        {"metadata": {"name": "spark-exec-b-conf-map", "ownerReferences": [OWNER]}},
    ]

    def request(method: str, path: str, body: dict | None) -> dict:
        calls.append((method, path, body))
        return {"items": maps} if method == "GET" else {}

    assert adopt_config_maps(request, "cafe", "spark-app-1", OWNER) == ["spark-exec-a-conf-map"]
    get, patch = calls
    assert get == (
        "GET",
        "/api/v1/namespaces/cafe/configmaps?labelSelector=spark-app-selector=spark-app-1,spark-role=executor",
        None,
    )
    assert patch == (
        "PATCH",
        "/api/v1/namespaces/cafe/configmaps/spark-exec-a-conf-map",
        {"metadata": {"ownerReferences": [OWNER]}},
    )


def test_the_chart_names_no_driver_pod_to_spark_and_hands_the_driver_its_uid_and_template():
    queue = steps.validate(["specs/examples/cafe/coffee-orders.yaml"], None)[0]
    deployment = next(o for o in render(queue).objects if o["kind"] == "Deployment")
    (driver,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in driver["env"]}
    assert "spark.kubernetes.driver.pod.name" not in env["PYSPARK_SUBMIT_ARGS"]["value"]
    assert "spark.kubernetes.executor.podTemplateFile" not in env["PYSPARK_SUBMIT_ARGS"]["value"]
    assert env["QUEUEPLANE_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["QUEUEPLANE_EXECUTOR_POD_TEMPLATE"]["value"].endswith("/executor-pod-template.yaml")
