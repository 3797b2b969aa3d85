"""The Prometheus Operator's kinds the chart renders (PodMonitor, PrometheusRule), for offline checks.

The chart renders them only for a cluster that serves them (`queueplane render --api-versions`,
or the cluster itself under `helm upgrade`). The definitions come from the operator's own
CustomResourceDefinitions, which its Go module carries (example/prometheus-operator-crd); the
served versions' schemas, without their descriptions, ship in a file beside this module, so
that rendering checks those objects as strictly as Kubernetes' own kinds (closed to unknown
fields), with neither Go nor a download. Maintainers refresh the file when the pinned version
moves:

    python -m queueplane.deploy.monitoring_schema
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
MODULE = "github.com/prometheus-operator/prometheus-operator"
CRD_DIR = "example/prometheus-operator-crd"
KINDS = {
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}
# What `--api-versions` must name for the chart to render each kind (as `.Capabilities` has it).
API_VERSIONS = {kind: f"monitoring.coreos.com/v1/{kind}" for kind in KINDS}


def shipped_file() -> Path:
    return Path(__file__).with_name(f"prometheus-operator-{PROMETHEUS_OPERATOR_VERSION}.crds.json")


@cache
def monitoring_crds() -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of PodMonitor and PrometheusRule (served versions, schemas only)."""
    crds: list[dict[str, Any]] = json.loads(shipped_file().read_text(encoding="utf-8"))
    return crds


def _without_descriptions(node: Any) -> Any:
    """A schema without its prose: `description` keywords go; a property named description stays."""
    if isinstance(node, dict):
        return {
            key: _without_descriptions(value)
            for key, value in node.items()
            if not (key == "description" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [_without_descriptions(value) for value in node]
    return node


def slim(crd: dict[str, Any]) -> dict[str, Any]:
    """What checking needs of a CRD: its group, kind and each served version's schema."""
    spec = crd["spec"]
    return {
        "apiVersion": crd["apiVersion"],
        "kind": crd["kind"],
        "metadata": {"name": crd["metadata"]["name"]},
        "spec": {
            "group": spec["group"],
            "names": {"kind": spec["names"]["kind"]},
            "versions": [
                {
                    "name": version["name"],
                    "served": version["served"],
                    "schema": _without_descriptions(version["schema"]),
                }
                for version in spec["versions"]
                if version.get("served")
            ],
        },
    }


def main() -> None:
    from queueplane.deploy.kube_schema_refresh import module_source

    folder = module_source(MODULE, PROMETHEUS_OPERATOR_VERSION, "the Prometheus Operator's module") / CRD_DIR
    crds = [slim(yaml.safe_load((folder / name).read_text(encoding="utf-8"))) for name in KINDS.values()]
    target = shipped_file()
    target.write_text(json.dumps(crds, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote the schemas of {', '.join(KINDS)} (Prometheus Operator {PROMETHEUS_OPERATOR_VERSION}) to {target}")


if __name__ == "__main__":
    main()
