"""Regenerate the Kubernetes API schemas queueplane ships (maintainers only; needs Go).

    python -m queueplane.deploy.kube_schema_refresh

Kubernetes publishes its OpenAPI v3 documents in its source tree (api/openapi-spec/v3); the Go
module proxy serves that tree (`go mod download k8s.io/kubernetes@<version>`). This takes the
component schemas of the kinds a worker's release may hold, and every schema they reach, and
writes them to the file kube_schema.py reads, so rendering and deploying need no Go and no
download. Run it when KUBERNETES_VERSION changes, and commit the file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from queueplane.deploy.kube_schema import CHECKED_KINDS, KUBERNETES_VERSION, shipped_schemas_file

MODULE = "k8s.io/kubernetes"
SPEC_DIR = "api/openapi-spec/v3"


def module_source(module: str, version: str, what: str) -> Path:
    """The source folder of a Go module at ``version``, downloaded through the module proxy
    (``what``: what it is, for the message when go is missing); exits with go's error."""
    go = shutil.which("go")
    if go is None:
        sys.exit(f"go is not on PATH: it downloads {what} through the module proxy")
    with tempfile.TemporaryDirectory() as work:
        result = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            cwd=work,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        sys.exit(f"go mod download {module}@{version} failed: {result.stderr.strip()[-1000:]}")
    return Path(json.loads(result.stdout)["Dir"])


def _documents(version: str) -> Iterator[dict[str, Any]]:
    source = module_source(MODULE, version, "the Kubernetes source")
    for path in sorted((source / SPEC_DIR).glob("*_openapi.json")):
        yield json.loads(path.read_text(encoding="utf-8"))


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value.rsplit("/", 1)[-1]
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def reachable_schemas(schemas: dict[str, Any]) -> dict[str, Any]:
    """The schemas of CHECKED_KINDS and every schema they reference."""
    roots = [
        name
        for name, schema in schemas.items()
        for gvk in schema.get("x-kubernetes-group-version-kind", [])
        if (f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"], gvk["kind"]) in CHECKED_KINDS
        and "metadata" in schema.get("properties", {})
    ]
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_references(schemas[name]))
    return {name: schemas[name] for name in sorted(seen)}


def main() -> None:
    schemas: dict[str, Any] = {}
    for document in _documents(KUBERNETES_VERSION):
        schemas.update(document.get("components", {}).get("schemas", {}))
    kept = reachable_schemas(schemas)
    # One schema a line: small diffs when the version moves.
    lines = [f"{json.dumps(name)}: {json.dumps(kept[name], sort_keys=True, separators=(',', ':'))}" for name in kept]
    target = shipped_schemas_file()
    target.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
    print(f"wrote {len(kept)} schemas of Kubernetes {KUBERNETES_VERSION} to {target}")


if __name__ == "__main__":
    main()
