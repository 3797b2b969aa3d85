"""The chart's extension points for shared clusters, for the driver and for the executors apart.

Each value must reach the pods it names: the driver's through its Deployment, the executors'
through Spark's own settings where Spark has one (the node selector) and otherwise through the
chart's executor pod template (tolerations, affinity, priority, spread, variables, volumes).
The values schema stays closed, and a host path is refused by queueplane, by the schema and by
the templates. Also here: the PodDisruptionBudgets, `helm test` and the alerts' runbooks.
"""

from __future__ import annotations

import http.server
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, REPO

from queueplane.deploy import cluster_values
from queueplane.deploy.helm import HelmError, run_helm
from queueplane.deploy.monitoring_schema import API_VERSIONS
from queueplane.deploy.render import chart_path, executor_pod_templates, render
from queueplane.errors import UsageError
from queueplane.provision import steps

AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
            ]
        }
    }
}
ANTI_AFFINITY = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "executor"}},
                },
            }
        ]
    }
}
SPREAD = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}]
SHARED = {
    "nodeSelector": {"kubernetes.io/os": "linux", "pool": "general"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "queues", "effect": "NoSchedule"}],
}
DRIVER_POD = {
    "affinity": AFFINITY,
    "tolerations": [{"key": "drivers", "operator": "Exists"}],
    "nodeSelector": {"pool": "drivers"},
    "priorityClassName": "queue-drivers",
    "topologySpreadConstraints": SPREAD,
    "extraEnv": [
        {"name": "TZ", "value": "UTC"},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
    ],
    "extraVolumes": [{"name": "certs", "secret": {"secretName": "company-ca"}}],
    "extraVolumeMounts": [{"name": "certs", "mountPath": "/etc/company-ca", "readOnly": True}],
}
EXECUTOR_POD = {
    "affinity": ANTI_AFFINITY,
    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"pool": "spot"},
    "priorityClassName": "queue-executors",
    "topologySpreadConstraints": [{**SPREAD[0], "maxSkew": 2}],
    "extraEnv": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    "extraVolumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
    "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
}
EXTENDED = {**SHARED, "driverPod": DRIVER_POD, "executorPod": EXECUTOR_POD}


def _coffee():
    return steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    return render(_coffee(), output_dir=tmp_path_factory.mktemp("extended"), overrides=EXTENDED)


def _kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def _driver_pod(objects) -> dict:
    (deployment,) = _kind(objects, "Deployment")
    return deployment["spec"]["template"]


def _submit_args(objects) -> list[str]:
    env = {e["name"]: e.get("value") for e in _driver_pod(objects)["spec"]["containers"][0]["env"]}
    return shlex.split(env["PYSPARK_SUBMIT_ARGS"])[:-1]


def test_each_driver_value_reaches_the_driver_deployment(extended):
    pod = _driver_pod(extended.objects)["spec"]
    assert pod["affinity"] == AFFINITY
    assert pod["tolerations"] == SHARED["tolerations"] + DRIVER_POD["tolerations"], "the shared ones first"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "drivers"}, "the driver's own wins"
    assert pod["priorityClassName"] == "queue-drivers"
    assert pod["topologySpreadConstraints"] == SPREAD
    container = pod["containers"][0]
    assert container["env"][-2:] == DRIVER_POD["extraEnv"], "after the chart's own"
    assert {"name": "certs", "secret": {"secretName": "company-ca"}} in pod["volumes"]
    assert {"name": "certs", "mountPath": "/etc/company-ca", "readOnly": True} in container["volumeMounts"]
    (template,) = executor_pod_templates(extended.objects)
    assert "certs" not in {v["name"] for v in template["spec"]["volumes"]}, "the driver's alone"


def test_each_executor_value_reaches_sparks_settings_or_the_charts_executor_pod_template(extended):
    (template,) = executor_pod_templates(extended.objects)
    spec = template["spec"]
    assert spec["affinity"] == ANTI_AFFINITY
    assert spec["tolerations"] == SHARED["tolerations"] + EXECUTOR_POD["tolerations"]
    assert spec["priorityClassName"] == "queue-executors"
    assert spec["topologySpreadConstraints"] == EXECUTOR_POD["topologySpreadConstraints"]
    container = spec["containers"][0]
    assert container["env"] == EXECUTOR_POD["extraEnv"]
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}} in spec["volumes"]
    assert {"name": "scratch", "mountPath": "/scratch"} in container["volumeMounts"]
    # Spark has a setting for the executors' node selector, and adds it to each executor pod itself.
    selectors = {a for a in _submit_args(extended.objects) if ".node.selector." in a}
    assert selectors == {
        "spark.kubernetes.executor.node.selector.kubernetes.io/os=linux",
        "spark.kubernetes.executor.node.selector.pool=spot",
    }
    assert "nodeSelector" not in spec, "one place for it"
    driver = _driver_pod(extended.objects)["spec"]
    assert driver["priorityClassName"] != spec["priorityClassName"] and driver["affinity"] != spec["affinity"]


def test_pod_disruption_budgets_are_off_by_default_and_select_the_driver_and_the_executors(extended, tmp_path):
    assert not _kind(extended.objects, "PodDisruptionBudget")
    budgets = {"driver": {"enabled": True, "minAvailable": 1}, "executor": {"enabled": True, "minAvailable": 2}}
    rendered = render(_coffee(), output_dir=tmp_path, overrides={"podDisruptionBudget": budgets})
    pdbs = {o["metadata"]["name"]: o["spec"] for o in _kind(rendered.objects, "PodDisruptionBudget")}
    assert sorted(pdbs) == ["coffee-orders-driver", "coffee-orders-executor"]
    assert pdbs["coffee-orders-driver"]["minAvailable"] == 1 and pdbs["coffee-orders-executor"]["minAvailable"] == 2
    assert all(p["unhealthyPodEvictionPolicy"] == "AlwaysAllow" for p in pdbs.values()), "a stuck pod never blocks"
    driver_labels = _driver_pod(rendered.objects)["metadata"]["labels"]
    (template,) = executor_pod_templates(rendered.objects)
    for name, labels in (
        ("coffee-orders-driver", driver_labels),
        ("coffee-orders-executor", template["metadata"]["labels"]),
    ):
        selector = pdbs[name]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), name
    assert pdbs["coffee-orders-driver"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "driver"
    only = render(
        _coffee(), output_dir=tmp_path / "one", overrides={"podDisruptionBudget": {"executor": {"enabled": True}}}
    )
    assert [o["metadata"]["name"] for o in _kind(only.objects, "PodDisruptionBudget")] == ["coffee-orders-executor"]


HOST_PATH = {"executorPod": {"extraVolumes": [{"name": "node", "hostPath": {"path": "/"}}]}}


@pytest.mark.parametrize("role", ["driverPod", "executorPod"])
def test_a_host_path_is_refused_by_queueplane_the_schema_and_the_templates(tmp_path, role):
    values = {role: {"extraVolumes": [{"name": "node", "hostPath": {"path": "/"}}]}}
    with pytest.raises(
        UsageError, match=rf"cluster.yaml: /{role}/extraVolumes/0/hostPath: refused: a worker never mounts a host path"
    ):
        cluster_values.checked(values, "cluster.yaml")
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    chart = str(chart_path())
    with pytest.raises(HelmError, match="additional properties 'hostPath' not allowed"):  # the schema's words
        run_helm(["template", "q", chart, "--values", str(file)])
    with pytest.raises(HelmError, match=rf"{role}.extraVolumes\[0\].hostPath is refused"):
        run_helm(["template", "q", chart, "--skip-schema-validation", "--values", str(file)])
    # A volume of an admitted kind passes all three.
    allowed = {role: {"extraVolumes": [{"name": "node", "emptyDir": {}}]}}
    assert cluster_values.checked(allowed, "cluster.yaml") == allowed
    file.write_text(yaml.safe_dump(allowed))
    run_helm(["template", "q", chart, "--values", str(file)])


@pytest.mark.parametrize(
    "bad",
    [
        "driverPod.colour=blue",
        "executorPod.affinity.nodeAffinty.x=1",
        "executorPod.extraVolumes[0].name=node",  # a volume with no source
        "driverPod.priorityClassName=Not_A_Name",
        "podDisruptionBudget.driver.minAvailable=50%",
        "podDisruptionBudget.executor.maxUnavailable=1",
        "sparkAuth.generate=true",
        "helmTest.image=busybox",
        "monitoring.prometheusRule.severities.QueueplaneSomethingElse=page",
        "monitoring.prometheusRule.runbookBaseUrl=javascript:alert(1)",
    ],
)
def test_the_values_schema_stays_closed_and_types_every_new_value(bad):
    with pytest.raises(HelmError, match=r"values don't meet the specifications|schema"):
        run_helm(["template", "q", str(chart_path()), "--set", bad])


@pytest.mark.parametrize(
    ("variable", "says"),
    [
        ({"name": "PYSPARK_SUBMIT_ARGS", "value": "--conf spark.authenticate=false"}, "PYSPARK_SUBMIT_ARGS is refused"),
        ({"name": "SPARK_USER", "value": "root"}, "SPARK_USER is refused"),
        ({"name": "JAVA_TOOL_OPTIONS", "value": "-Dx=y"}, "JAVA_TOOL_OPTIONS is refused"),
        ({"name": "QUEUEPLANE_KAFKA_CONFIG", "value": "/x"}, "QUEUEPLANE_KAFKA_CONFIG is refused"),
        ({"name": "DB_PASSWORD", "value": "hunter2"}, "DB_PASSWORD .*literal value"),
    ],
)
def test_extra_env_sets_neither_the_charts_nor_sparks_variables_nor_a_credential(tmp_path, variable, says):
    values = {"executorPod": {"extraEnv": [variable]}}
    with pytest.raises(UsageError, match=r"/executorPod/extraEnv/0/"):
        cluster_values.checked(values, "cluster.yaml")
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    with pytest.raises(HelmError, match=r"/executorPod/extraEnv/0(/name)?': 'not' failed"):  # the schema's words
        run_helm(["template", "q", str(chart_path()), "--values", str(file)])
    with pytest.raises(HelmError, match=says):
        run_helm(["template", "q", str(chart_path()), "--skip-schema-validation", "--values", str(file)])


def _test_pod(objects) -> dict:
    (pod,) = _kind(objects, "Pod")
    return pod


def test_helm_test_asks_the_drivers_readyz_through_its_service_under_pod_security_restricted(extended, tmp_path):
    pod = _test_pod(extended.objects)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["args"][-1] == "http://coffee-orders-driver.cafe.svc:9404/readyz"
    assert container["image"] == _driver_pod(extended.objects)["spec"]["containers"][0]["image"], "no other image"
    # What Pod Security "restricted" asks of a pod and its containers.
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in spec and "volumes" not in spec and spec["automountServiceAccountToken"] is False
    # The release's NetworkPolicy admits its own pods to the driver whoever else may scrape it.
    assert {"app.kubernetes.io/name", "app.kubernetes.io/instance"} <= set(pod["metadata"]["labels"])
    assert spec["tolerations"] == SHARED["tolerations"] + DRIVER_POD["tolerations"], "schedules where drivers do"
    off = render(_coffee(), output_dir=tmp_path, overrides={"helmTest": {"enabled": False}})
    assert not _kind(off.objects, "Pod")


class _Health(http.server.BaseHTTPRequestHandler):
    answer = (200, b"ready")

    def do_GET(self) -> None:
        code, body = self.answer
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body if self.path == "/readyz" else b"wrong path")

    def log_message(self, *args: object) -> None:
        pass


def test_helm_tests_script_passes_on_ready_and_fails_with_the_workers_reason(extended):
    """The test pod's own command, run here against a server answering as run/driver/health.py does."""
    container = _test_pod(extended.objects)["spec"]["containers"][0]
    assert container["command"] == ["python3", "-c"]
    script = container["args"][0]
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/readyz"
    try:
        ok = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0 and "200 ready" in ok.stdout, ok.stderr
        _Health.answer = (503, b"Kafka last answered 41s ago")
        failed = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=30)
        assert failed.returncode == 1 and "answered 503: Kafka last answered 41s ago" in failed.stderr
    finally:
        _Health.answer = (200, b"ready")
        server.shutdown()


ALERTS = ["QueueplaneLagOverTarget", "QueueplaneDeadLettering", "QueueplaneNoProgress", "QueueplaneExecutorsAtMax"]


def _rules(tmp_path, overrides=None) -> dict[str, dict]:
    versions = [API_VERSIONS["PrometheusRule"]]
    rendered = render(_coffee(), output_dir=tmp_path, overrides=overrides or {}, api_versions=versions)
    (rule,) = _kind(rendered.objects, "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_every_alert_has_a_severity_and_a_runbook_whose_section_the_docs_have(tmp_path):
    rules = _rules(tmp_path / "default")
    assert list(rules) == ALERTS
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    headings = {
        re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-")) for h in re.findall(r"^#+ (.+)$", docs, re.M)
    }
    for alert, rule in rules.items():
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == "https://github.com/queueplane/queueplane/blob/main/docs/kubernetes.md"
        assert anchor == alert.lower() and anchor in headings, f"docs/kubernetes.md has no section for {alert}"
        assert rule["labels"]["severity"] == ("critical" if alert == "QueueplaneNoProgress" else "warning")
    prometheus_rule = {
        "severity": "ticket",
        "severities": {"QueueplaneDeadLettering": "page"},
        "runbookBaseUrl": "https://runbooks.example.com/queues",
    }
    changed = _rules(tmp_path / "changed", {"monitoring": {"prometheusRule": prometheus_rule}})
    assert {a: r["labels"]["severity"] for a, r in changed.items()} == {
        "QueueplaneLagOverTarget": "ticket",
        "QueueplaneDeadLettering": "page",
        "QueueplaneNoProgress": "critical",  # the chart's own entry, merged as helm merges maps
        "QueueplaneExecutorsAtMax": "ticket",
    }
    assert changed["QueueplaneNoProgress"]["annotations"]["runbook_url"] == (
        "https://runbooks.example.com/queues#queueplanenoprogress"
    )


def test_values_yaml_documents_every_new_value():
    """helm-docs style: a `# --` comment above each value under the extension points."""
    lines = (chart_path() / "values.yaml").read_text().splitlines()
    documented = set()
    path: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        found = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
        if not found:
            continue
        indent, key = len(found.group(1)), found.group(2)
        path = [(i, k) for i, k in path if i < indent] + [(indent, key)]
        above = lines[number - 1].strip() if number else ""
        if above.startswith("# --") or (above.startswith("#") and _comment_block_starts_with_dashes(lines, number)):
            documented.add(".".join(k for _, k in path))
    values = yaml.safe_load((chart_path() / "values.yaml").read_text())
    leaves = [f"{section}.{key}" for section in ("driverPod", "executorPod") for key in values[section]]
    leaves += [f"podDisruptionBudget.{c}.{k}" for c in ("driver", "executor") for k in values["podDisruptionBudget"][c]]
    leaves += ["sparkAuth.existingSecret", "helmTest.enabled", "nodeSelector", "tolerations", "podAnnotations"]
    leaves += ["monitoring.prometheusRule.severities", "monitoring.prometheusRule.runbookBaseUrl"]
    assert [leaf for leaf in leaves if leaf not in documented] == []


def _comment_block_starts_with_dashes(lines: list[str], number: int) -> bool:
    index = number - 1
    while index >= 0 and lines[index].strip().startswith("#"):
        if lines[index].strip().startswith("# --"):
            return True
        index -= 1
    return False


def test_the_chart_lints_with_every_extension_set(tmp_path, extended):
    run_helm(["lint", str(chart_path()), "--strict", "--values", str(extended.values_file)])
    assert Path(extended.values_file).is_file()
