"""Offline, strict validation of Kubernetes objects against a pinned Kubernetes release's API.

The schemas come from the OpenAPI v3 documents Kubernetes publishes in its source tree:
queueplane ships those of the kinds a worker's release may hold (CHECKED_KINDS) in a file
beside this module, written by kube_schema_refresh.py, so checking needs neither Go nor a
download. The API server prunes or rejects unknown fields; these documents do not say so, so
every object schema is closed here (additionalProperties false) unless Kubernetes marks it as
open. An object with a misspelt field, a wrong type or a
missing required field fails, as it would on `kubectl apply --validate=strict`.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

KUBERNETES_VERSION = "v1.35.4"
_REF_PREFIX = "#/components/schemas/"
# What a worker's release may hold (and Helm chart tests, and what the platform adds around it).
CHECKED_KINDS = frozenset(
    {
        ("v1", "ConfigMap"),
        ("v1", "Namespace"),
        ("v1", "PersistentVolumeClaim"),
        ("v1", "Pod"),
        ("v1", "Secret"),
        ("v1", "Service"),
        ("v1", "ServiceAccount"),
        ("apps/v1", "Deployment"),
        ("apps/v1", "StatefulSet"),
        ("batch/v1", "Job"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("policy/v1", "PodDisruptionBudget"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
    }
)


def shipped_schemas_file() -> Path:
    return Path(__file__).with_name(f"kubernetes-{KUBERNETES_VERSION}.schemas.json")


def _close(node: Any) -> Any:
    """A copy of a schema node with every object schema closed to unknown fields."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            node[key] = [_close(n) for n in node[key]]
    if "items" in node:
        node["items"] = _close(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _close(node["additionalProperties"])
    if "properties" in node:
        node["properties"] = {name: _close(sub) for name, sub in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    return node


@cache
def _schemas() -> tuple[dict[str, Any], dict[tuple[str, str], str]]:
    """All component schemas (closed), and (apiVersion, kind) → schema name."""
    schemas: dict[str, Any] = json.loads(shipped_schemas_file().read_text(encoding="utf-8"))
    kinds: dict[tuple[str, str], str] = {}
    for name, schema in schemas.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            # Only top-level resources: their schemas have metadata (List and options types do not count).
            if "metadata" in schema.get("properties", {}) and not gvk["kind"].endswith(("List", "Options")):
                kinds[(api_version, gvk["kind"])] = name
    return {name: _close(copy.deepcopy(s)) for name, s in schemas.items()}, kinds


@cache
def _validator(schema_name: str) -> Draft202012Validator:
    schemas, _ = _schemas()
    return Draft202012Validator({"$ref": _REF_PREFIX + schema_name, "components": {"schemas": schemas}})


CustomKinds = dict[tuple[str, str], Draft202012Validator]


def custom_kinds(definitions: list[dict[str, Any]]) -> CustomKinds:
    """Validators for the kinds that CustomResourceDefinitions add, from each served version's schema.

    A chart that ships its own CRDs (crds/) renders objects of those kinds; they are checked
    as strictly as built-in ones (closed to unknown fields, as ``kubectl apply --validate=strict``).
    """
    kinds: CustomKinds = {}
    for crd in definitions:
        spec = crd.get("spec") or {}
        for version in spec.get("versions") or []:
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if version.get("served") and schema:
                api_version = f"{spec['group']}/{version['name']}"
                kinds[(api_version, spec["names"]["kind"])] = Draft202012Validator(_close(copy.deepcopy(schema)))
    return kinds


def object_problems(obj: dict[str, Any], custom: CustomKinds | None = None) -> list[str]:
    """What is wrong with one object, as 'Kind/name: /json/pointer: message' lines; empty if it is valid.

    ``custom``: the kinds of CustomResourceDefinitions shipped beside the objects (custom_kinds).
    """
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    name = (obj.get("metadata") or {}).get("name", "?")
    label = f"{kind}/{name}"
    _, kinds = _schemas()
    schema_name = kinds.get((api_version, kind))  # type: ignore[arg-type]
    validator = (custom or {}).get((api_version, kind))  # type: ignore[arg-type]
    if schema_name is None and validator is None:
        return [
            f"{label}: apiVersion {api_version!r} kind {kind!r} is not among the kinds checked against "
            f"Kubernetes {KUBERNETES_VERSION} (deploy/kube_schema.py CHECKED_KINDS) or defined by the chart's CRDs"
        ]
    if validator is None:
        validator = _validator(schema_name)
    problems = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        pointer = "/" + "/".join(str(p) for p in error.absolute_path)
        problems.append(f"{label}: {pointer}: {error.message}")
    return problems
