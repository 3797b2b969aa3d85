"""The chart's monitoring: alert rules tested with promtool, and what renders where.

promtool is Prometheus' own rule tester, built with Prometheus from the Go module proxy
(`queueplane local fetch`). The alerts are rendered by the real chart for an example spec;
alert_rules.test.yaml feeds them series and says when each fires.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from helpers import EXAMPLES
from monitoring_support import dashboard_queries, rendered_objects, write_rules

from queueplane.deploy.render import render
from queueplane.local.prometheus import promtool_binary
from queueplane.provision import steps

RULES_TEST = Path(__file__).with_name("alert_rules.test.yaml")


def _coffee():
    return steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]


def _promtool(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([str(promtool_binary()), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_each_alert_fires_after_its_for_and_only_for_its_own_queue(tmp_path):
    write_rules(_coffee(), tmp_path)
    shutil.copy(RULES_TEST, tmp_path / "alerts.test.yaml")
    tested = _promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_thresholds_are_values_and_promtool_notices_a_changed_one(tmp_path):
    """The same tests against rules with a longer lag window fail: the tests above can fail."""
    write_rules(_coffee(), tmp_path, "--set", "monitoring.prometheusRule.lagFor=30m")
    shutil.copy(RULES_TEST, tmp_path / "alerts.test.yaml")
    tested = _promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert tested.returncode != 0
    assert "QueueplaneLagOverTarget" in tested.stdout + tested.stderr


def test_monitoring_objects_render_only_where_the_cluster_serves_their_kinds(tmp_path):
    plain = {o["kind"] for o in render(_coffee(), output_dir=tmp_path / "plain").objects}
    assert not plain & {"PodMonitor", "PrometheusRule"}, "no Prometheus Operator: nothing it would refuse"
    objects = {o["kind"]: o for o in rendered_objects(_coffee(), tmp_path / "operator")}
    monitor = objects["PodMonitor"]
    assert monitor["metadata"]["namespace"] == "cafe"
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "queue-worker",
        "app.kubernetes.io/instance": "coffee-orders",
        "app.kubernetes.io/component": "driver",
    }
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    alerts = [r["alert"] for g in objects["PrometheusRule"]["spec"]["groups"] for r in g["rules"]]
    assert alerts == [
        "QueueplaneLagOverTarget",
        "QueueplaneDeadLettering",
        "QueueplaneNoProgress",
        "QueueplaneExecutorsAtMax",
    ]
    off = rendered_objects(_coffee(), tmp_path / "off", "--set", "monitoring.podMonitor.enabled=false")
    assert "PodMonitor" not in {o["kind"] for o in off}


def test_every_dashboard_query_is_promql_that_promtool_accepts(tmp_path):
    queries = dashboard_queries("cafe", "coffee-orders", "1m")
    assert len(queries) >= 12
    rules = [{"record": f"dashboard:query_{n}", "expr": expr} for n, expr in enumerate(queries.values())]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = _promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = {"groups": [{"name": "d", "rules": [{"record": "d:x", "expr": queries[next(iter(queries))] + ")"}]}]}
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    assert _promtool("check", "rules", "broken.yaml", cwd=tmp_path).returncode != 0


def test_the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar(tmp_path):
    objects = rendered_objects(_coffee(), tmp_path, "--set", "monitoring.grafanaDashboard.enabled=true")
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "queueplane-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = yaml.safe_load(config_map["data"]["queueplane.json"])
    assert dashboard["uid"] == "queueplane-queue"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "namespace", "queue"}
