"""What the platform requires of every rendered workload, beyond the Kubernetes schema.

A cluster admin reviews these rules once instead of every chart change: images are pinned,
containers declare their resources and never run as root, and the driver's role grants
exactly what Spark's driver does with executor pods in its own namespace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# In client mode the driver creates, watches and deletes its executor pods and the config
# map of their Spark settings; and it reports its own Queues' status. Nothing else (no
# services: the chart makes the driver's; no volume claims: executors claim none).
# Keys: (API group, resource).
DRIVER_RBAC: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset({"get", "list", "watch", "create", "delete", "deletecollection"}),
    # patch: the driver owns the executors' ConfigMap Spark makes (run/spark/executor_pods.py).
    ("", "configmaps"): frozenset({"get", "list", "create", "patch", "delete", "deletecollection"}),
    ("queueplane.io", "queues/status"): frozenset({"get", "patch"}),
}
# Resources a rule must name objects of: the Queue objects of the release (one per queue).
NAMED_ONLY = frozenset({("queueplane.io", "queues/status")})
CLUSTER_WIDE_KINDS = frozenset({"ClusterRole", "ClusterRoleBinding"})
REQUIRED_RESOURCES = (("requests", "cpu"), ("requests", "memory"), ("limits", "memory"))


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a workload object (Pod or a controller with a pod template), else None."""
    if obj.get("kind") == "Pod":
        return obj.get("spec") or {}
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict):
        return template.get("spec") or {}
    return None


def _image_problem(image: str) -> str | None:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if "@sha256:" in image:
        return None
    if ":" not in last:
        return f"image {image!r} has no tag (it means :latest); pin a tag or digest"
    if last.rsplit(":", 1)[1] == "latest":
        return f"image {image!r} uses :latest; pin a tag or digest"
    return None


def _container_problems(label: str, spec: dict[str, Any], workload: bool) -> list[str]:
    problems = []
    pod_context = spec.get("securityContext") or {}
    if pod_context.get("runAsNonRoot") is not True:
        problems.append(f"{label}: the pod does not set securityContext.runAsNonRoot: true")
    if pod_context.get("runAsUser") == 0:
        problems.append(f"{label}: the pod runs as user 0 (root)")
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        where = f"{label}: container {container.get('name')!r}"
        context = container.get("securityContext") or {}
        if context.get("runAsUser") == 0 or context.get("runAsNonRoot") is False:
            problems.append(f"{where} runs as root")
        if context.get("privileged") is True or context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where} may gain privileges (set allowPrivilegeEscalation: false, not privileged)")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where} has a writable root filesystem")
        if "image" in container:
            problem = _image_problem(container["image"])
            if problem:
                problems.append(f"{where}: {problem}")
        elif workload:
            problems.append(f"{where} has no image")
        if workload:  # Spark sizes executor pods itself; templates carry no resources
            resources = container.get("resources") or {}
            for section, name in REQUIRED_RESOURCES:
                if name not in (resources.get(section) or {}):
                    problems.append(f"{where} sets no resources.{section}.{name}")
    return problems


def _role_problems(label: str, role: dict[str, Any], own: frozenset[str]) -> list[str]:
    """``own``: the names of the release's own Queue objects."""
    problems = []
    for number, rule in enumerate(role.get("rules") or []):
        where = f"{label}: rule {number}"
        if rule.get("nonResourceURLs"):
            problems.append(f"{where} reaches URLs the driver does not use")
        names = rule.get("resourceNames") or []
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                allowed = DRIVER_RBAC.get((group, resource))
                shown = f"{group}/{resource}" if group else resource
                if allowed is None:
                    problems.append(f"{where} grants access to {shown!r}, which the driver does not manage")
                    continue
                extra = sorted(set(rule.get("verbs") or []) - allowed)
                if extra:
                    problems.append(f"{where} grants {extra} on {shown}; the driver needs only {sorted(allowed)}")
                if (group, resource) in NAMED_ONLY and (not names or not set(names) <= own):
                    problems.append(
                        f"{where} must name only the release's own Queue objects {sorted(own)} in resourceNames"
                    )
                elif (group, resource) not in NAMED_ONLY and names:
                    problems.append(f"{where} names {shown} objects; the driver's own objects have generated names")
    return problems


def policy_problems(objects: Sequence[dict[str, Any]], pod_templates: Sequence[dict[str, Any]] = ()) -> list[str]:
    """Every policy breach in the rendered objects (and in pod templates handed to Spark)."""
    problems: list[str] = []
    queues = frozenset(o["metadata"]["name"] for o in objects if o.get("kind") == "Queue" and o.get("metadata"))
    for obj in objects:
        label = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name', '?')}"
        if obj.get("kind") in CLUSTER_WIDE_KINDS:
            problems.append(f"{label}: a worker gets no cluster-wide permissions")
        if obj.get("kind") == "Role":
            problems += _role_problems(label, obj, queues)
        spec = pod_spec(obj)
        if spec is not None:
            problems += _container_problems(label, spec, workload=True)
    for template in pod_templates:
        application = template.get("metadata", {}).get("labels", {}).get("queueplane.io/application")
        label = f"executor pod template of {application}"
        problems += _container_problems(label, template.get("spec") or {}, workload=False)
    return problems
