"""The chart's monitoring objects rendered for one queue, as Prometheus and Grafana get them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from queueplane.deploy.helm import run_helm
from queueplane.deploy.render import chart_path, render
from queueplane.spec.model import QueueSpec

MONITORING_KINDS = ("monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule")
DASHBOARD = chart_path() / "dashboards" / "queueplane.json"


def rendered_objects(queue: QueueSpec, folder: Path, *extra: str) -> list[dict]:
    """`helm template` of the queue's release on a cluster that serves the Prometheus Operator's kinds."""
    values = render(queue, output_dir=folder).values_file
    api_versions = [arg for kind in MONITORING_KINDS for arg in ("--api-versions", kind)]
    args = ["template", queue.name, str(chart_path()), "--namespace", queue.namespace, "--values", str(values)]
    manifests = run_helm([*args, *api_versions, *extra]).stdout
    return [obj for obj in yaml.safe_load_all(manifests) if obj]


def write_rules(queue: QueueSpec, folder: Path, *extra: str) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file (what the operator hands Prometheus)."""
    (rule,) = [o for o in rendered_objects(queue, folder, *extra) if o["kind"] == "PrometheusRule"]
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False), encoding="utf-8")
    return path


def dashboard_queries(namespace: str, queue: str, rate_interval: str) -> dict[str, str]:
    """Every panel query of the dashboard with its variables filled in, by 'panel title / legend'."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    filled = {"$namespace": namespace, "$queue": queue, "$__rate_interval": rate_interval}
    queries = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\$__rate_interval|\$namespace|\$queue", lambda m: filled[m.group(0)], target["expr"])
            queries[f"{panel['title']} / {target['legendFormat']}"] = expr
    return queries
