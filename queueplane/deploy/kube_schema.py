"""Offline, strict validation of Kubernetes objects against a pinned Kubernetes release's API.

The schemas are the OpenAPI v3 documents Kubernetes publishes in its source tree
(api/openapi-spec/v3), fetched once through the Go module proxy (`go mod download
k8s.io/kubernetes@<version>`) and cached. The API server prunes or rejects unknown fields;
these documents do not say so, so every object schema is closed here (additionalProperties
false) unless Kubernetes marks it as open. An object with a misspelt field, a wrong type or a
missing required field fails, as it would on `kubectl apply --validate=strict`.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from queueplane.errors import QueueplaneError
from queueplane.paths import cache_dir

KUBERNETES_VERSION = "v1.35.4"
_MODULE = "k8s.io/kubernetes"
_SPEC_DIR = "api/openapi-spec/v3"
_REF_PREFIX = "#/components/schemas/"


class KubeSchemaError(QueueplaneError):
    """The Kubernetes API schemas could not be fetched."""


def openapi_dir() -> Path:
    """The cached OpenAPI v3 documents of the pinned release, fetched on first use."""
    target = cache_dir() / f"kubernetes-openapi-{KUBERNETES_VERSION}"
    if (target / ".complete").exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise KubeSchemaError(f"the Kubernetes {KUBERNETES_VERSION} API schemas are not cached and Go is not on PATH")
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        with tempfile.TemporaryDirectory() as work:
            result = subprocess.run(
                [go, "mod", "download", "-json", f"{_MODULE}@{KUBERNETES_VERSION}"],
                cwd=work,
                env={**os.environ, "GOFLAGS": "-mod=mod"},
                capture_output=True,
                text=True,
                timeout=900,
            )
            if result.returncode != 0:
                raise KubeSchemaError(
                    f"go mod download {_MODULE}@{KUBERNETES_VERSION} failed: {result.stderr.strip()[-1000:]}"
                )
            source = Path(json.loads(result.stdout)["Dir"]) / _SPEC_DIR
        for document in source.glob("*_openapi.json"):
            shutil.copyfile(document, target / document.name)
        (target / ".complete").write_text(KUBERNETES_VERSION)
    return target


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
    schemas: dict[str, Any] = {}
    for document in sorted(openapi_dir().glob("*_openapi.json")):
        schemas.update(json.loads(document.read_text(encoding="utf-8")).get("components", {}).get("schemas", {}))
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


def object_problems(obj: dict[str, Any]) -> list[str]:
    """What is wrong with one object, as 'Kind/name: /json/pointer: message' lines; empty if it is valid."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    name = (obj.get("metadata") or {}).get("name", "?")
    label = f"{kind}/{name}"
    _, kinds = _schemas()
    schema_name = kinds.get((api_version, kind))  # type: ignore[arg-type]
    if schema_name is None:
        return [f"{label}: apiVersion {api_version!r} kind {kind!r} is not served by Kubernetes {KUBERNETES_VERSION}"]
    problems = []
    for error in sorted(_validator(schema_name).iter_errors(obj), key=lambda e: list(e.absolute_path)):
        pointer = "/" + "/".join(str(p) for p in error.absolute_path)
        problems.append(f"{label}: {pointer}: {error.message}")
    return problems
