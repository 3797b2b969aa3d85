"""What Spark makes on Kubernetes for a driver pod of the chart, owned by that pod.

Spark makes its executors' pods, and one ConfigMap of their settings, owned by the driver pod
it is told of (``spark.kubernetes.driver.pod.name``), so Kubernetes deletes them with it. Told
of the pod, though, Spark's allocator first waits a second for that pod to be Ready, and ours
is not Ready until its queries run (the readiness probe is the worker's own ``/readyz``): the
wait always timed out, and every start logged an ERROR with a stack trace. The chart's driver
Service publishes the pod's address while it is not Ready, so the wait protects nothing here.

So the chart does not name the pod to Spark; the driver makes the ownership itself. The
executors' pod template gets the driver pod as its owner (Spark keeps a template's metadata
and adds its own to it), and the ConfigMap, which Spark makes when its context starts, is
given the same owner right after. Both sides of the ownership are read from the pod's own
environment (``POD_NAME`` and ``QUEUEPLANE_POD_UID``, from the downward API).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

# The chart's executor pod template, which the driver copies with its owner set.
TEMPLATE_ENV = "QUEUEPLANE_EXECUTOR_POD_TEMPLATE"
UID_ENV = "QUEUEPLANE_POD_UID"
TEMPLATE_FILE = "executor-pod-template.yaml"
# The labels Spark puts on what it makes for an application's executors.
APP_LABEL, ROLE_LABEL, EXECUTOR_ROLE = "spark-app-selector", "spark-role", "executor"

# One request to the API server: method, path, JSON body or None; the decoded answer.
Request = Callable[[str, str, dict[str, Any] | None], dict[str, Any]]


def driver_owner() -> dict[str, Any] | None:
    """The owner reference of this driver pod, or None outside the chart's driver pod."""
    name, uid = os.environ.get("POD_NAME"), os.environ.get(UID_ENV)
    if not name or not uid:
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}


def owned_template(source: Path, owner: dict[str, Any], folder: Path) -> Path:
    """The executors' pod template at ``source``, written to ``folder`` with ``owner`` as its owner."""
    pod = yaml.safe_load(source.read_text()) or {}
    metadata = pod.setdefault("metadata", {})
    metadata["ownerReferences"] = [*metadata.get("ownerReferences", []), owner]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / TEMPLATE_FILE
    target.write_text(yaml.safe_dump(pod, sort_keys=False))
    return target


def adopt_config_maps(request: Request, namespace: str, app_id: str, owner: dict[str, Any]) -> list[str]:
    """Give the ConfigMaps Spark made for ``app_id``'s executors ``owner`` as their owner; their names."""
    selector = f"{APP_LABEL}={app_id},{ROLE_LABEL}={EXECUTOR_ROLE}"
    listed = request("GET", f"/api/v1/namespaces/{namespace}/configmaps?labelSelector={selector}", None)
    adopted = []
    for item in listed.get("items", []):
        metadata = item["metadata"]
        owners = metadata.get("ownerReferences") or []
        if any(o.get("uid") == owner["uid"] for o in owners):
            continue
        patch = {"metadata": {"ownerReferences": [*owners, owner]}}
        request("PATCH", f"/api/v1/namespaces/{namespace}/configmaps/{metadata['name']}", patch)
        adopted.append(metadata["name"])
    return adopted
