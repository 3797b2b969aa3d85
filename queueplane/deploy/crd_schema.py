"""The Queue CRD's spec schema, generated from the spec's JSON Schema: one schema for the file and the cluster.

    python -m queueplane.deploy.crd_schema           # rewrite the chart's CRD (make crd)
    python -m queueplane.deploy.crd_schema --check   # exit 1 when the committed CRD is stale

A spec file and the cluster's ``Queue`` object share ``apiVersion: queueplane.io/v1, kind:
Queue``, and the deploy writes the file's ``spec`` into the object, so the CRD's ``spec``
schema is specs/queue-v1.schema.json's ``spec``, converted to what a structural schema may say
(structural.py holds Kubernetes' rules):

- ``$ref`` into ``$defs`` is inlined, the referring node's own keywords winning;
- ``const`` becomes a one-value ``enum``, and a node without ``type`` gets the one its enum
  values (or its properties or items) imply;
- ``additionalProperties: false`` beside ``properties`` goes: the API server prunes unknown
  fields, and refuses them under ``kubectl apply``'s strict field validation;
- ``uniqueItems`` becomes ``x-kubernetes-list-type: set`` (the API server refuses duplicates);
- a list of types becomes ``x-kubernetes-int-or-string`` for string-or-integer, else
  ``x-kubernetes-preserve-unknown-fields`` (any value): topic config values;
- ``propertyNames`` goes (a structural schema cannot check keys): topic config names;
- ``default`` goes: the object holds the spec as its file wrote it, and defaults are resolved in
  one place (spec/schema.py's ``apply_defaults``), not by the API server as well;
- ``errorMessage`` (queueplane's own message keyword) goes;
- inside ``not``/``allOf``/``anyOf``/``oneOf`` only value checks stay.

Any other keyword stops the generator with its JSON pointer, so a schema change that a
structural schema cannot say is decided here, not lost. Where the CRD checks less than the spec
check (``LOOSENED``), it is because only queueplane writes Queue objects: its deploy checks the
whole spec first, and the chart's admission policy refuses Queue objects made by anyone else.
The rest of the CRD (names, printer columns, the status schema) is edited in the CRD file
itself; the generator keeps it and rewrites only the spec schema.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from queueplane.deploy.structural import schema_problems
from queueplane.errors import QueueplaneError
from queueplane.paths import shipped_file
from queueplane.spec.schema import load_schema, schema_path

CRD_FILE = "charts/queue-worker/crds/queues.queueplane.io.yaml"
HEADER = """\
# The Queue resource: one per queue of a release, so that `kubectl get queues -A` lists every
# queue on the cluster with its state. The chart creates each object (templates/queue.yaml) with
# the queue's spec as deployed; the worker's driver writes its status every few seconds.
#
# GENERATED spec schema: `spec` below is specs/queue-v1.schema.json's `spec`, converted by
# queueplane/deploy/crd_schema.py (`make crd`; a unit test fails when this file is stale). Edit
# the spec's JSON Schema, not the spec schema here; names, printer columns and the status
# schema are edited here and kept by the generator.
#
# The deploy creates or updates this definition (and the admission policy in ../cluster/) before
# each release; Helm alone installs crds/ with the first release only and never upgrades it.
"""
# What a structural schema keeps as it is.
KEPT = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "enum",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "multipleOf",
    }
)
# Dropped everywhere: spec-file conveniences, not constraints (see the module docstring).
DROPPED = frozenset({"default", "errorMessage", "$comment", "examples", "title"})
JUNCTORS = ("not", "allOf", "anyOf", "oneOf")
# Value checks, the only keywords a junctor's schemas may hold.
VALUE_CHECKS = frozenset(
    {
        "enum",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "multipleOf",
        "required",
    }
)
# Where the CRD checks less than the spec check, by JSON pointer into the spec schema's `spec`.
LOOSENED = {
    "/topic/config": "config names are not checked, and values may be of any type",
    "/deadLetter/config": "config names are not checked, and values may be of any type",
}


class CrdSchemaError(QueueplaneError):
    """The spec's JSON Schema says something a structural schema cannot, or the CRD is stale."""


def crd_path() -> Path:
    return shipped_file(CRD_FILE)


def _type_of(values: list[Any]) -> str | None:
    kinds = {
        "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int) else type(v).__name__ for v in values
    }
    named = {"str": "string", "float": "number", "dict": "object", "list": "array"}
    words = {named.get(kind, kind) for kind in kinds}
    return words.pop() if len(words) == 1 else None


def _resolve(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    """``node`` with its ``$ref`` (and its target's, in turn) inlined; the node's own keywords win."""
    ref = node.get("$ref")
    if ref is None:
        return node
    if not isinstance(ref, str) or not ref.startswith("#/$defs/") or ref.removeprefix("#/$defs/") not in defs:
        raise CrdSchemaError(f"{where}/$ref: {ref!r} is not a reference into $defs")
    target = _resolve(defs[ref.removeprefix("#/$defs/")], defs, where)
    merged = dict(target)
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def _junctor(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    """A schema inside not/allOf/anyOf/oneOf: value checks only."""
    node = _resolve(node, defs, where)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in VALUE_CHECKS:
            out[key] = copy.deepcopy(value)
        elif key in ("description", "errorMessage"):
            continue  # a structural schema allows no description inside a junctor
        else:
            raise CrdSchemaError(f"{where}/{key}: a structural schema allows only value checks inside a junctor")
    return out


def convert(node: dict[str, Any], defs: dict[str, Any], where: str = "/properties/spec") -> dict[str, Any]:
    """One JSON Schema node (of the spec schema) as a structural schema node; see the module docstring."""
    node = _resolve(node, defs, where)
    out: dict[str, Any] = {}
    for key, value in node.items():
        here = f"{where}/{key}"
        if key in DROPPED or key == "propertyNames":
            continue
        if key == "type" and isinstance(value, list):
            out[
                "x-kubernetes-int-or-string"
                if set(value) == {"string", "integer"}
                else "x-kubernetes-preserve-unknown-fields"
            ] = True
        elif key == "const":
            out["enum"] = [copy.deepcopy(value)]
        elif key == "uniqueItems":
            if value:
                out["x-kubernetes-list-type"] = "set"
        elif key == "properties":
            out["properties"] = {name: convert(sub, defs, f"{here}/{name}") for name, sub in value.items()}
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out["additionalProperties"] = convert(value, defs, here)
            elif value is not False and value is not True:
                raise CrdSchemaError(f"{here}: expected a schema, true or false")
            # false: the API server prunes (or, strictly, refuses) unknown fields; true: the default.
        elif key == "items":
            if not isinstance(value, dict):
                raise CrdSchemaError(f"{here}: a structural schema needs one items schema")
            out["items"] = convert(value, defs, here)
        elif key in JUNCTORS:
            out[key] = (
                _junctor(value, defs, here)
                if key == "not"
                else [_junctor(sub, defs, f"{here}/{i}") for i, sub in enumerate(value)]
            )
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value  # OpenAPI v3.0: a flag beside it
            out[key] = True
        elif key in KEPT:
            out[key] = copy.deepcopy(value)
        else:
            raise CrdSchemaError(f"{here}: the keyword {key} has no structural-schema form in crd_schema.py")
    if "additionalProperties" in out and "properties" in out:
        raise CrdSchemaError(f"{where}: properties and a schema for additionalProperties cannot be said together")
    if "type" not in out and not (
        out.get("x-kubernetes-int-or-string") or out.get("x-kubernetes-preserve-unknown-fields")
    ):
        implied = _type_of(out["enum"]) if "enum" in out else None
        implied = implied or ("object" if "properties" in out else "array" if "items" in out else None)
        if implied is None:
            raise CrdSchemaError(f"{where}: no type, and none implied by an enum, properties or items")
        out["type"] = implied
    # type and description first, as people write schemas: the generated file reads like the rest.
    first = [key for key in ("type", "description") if key in out]
    return {**{key: out[key] for key in first}, **{k: v for k, v in out.items() if k not in first}}


def spec_schema(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The CRD's ``spec`` schema, from the spec's JSON Schema (specs/queue-v1.schema.json by default)."""
    schema = schema if schema is not None else load_schema()
    return convert(schema["properties"]["spec"], schema.get("$defs", {}))


def crd_document(current: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The CRD ``current`` with each version's spec schema replaced by ``spec``; CrdSchemaError if the
    result is no structural schema."""
    crd = copy.deepcopy(current)
    for version in crd["spec"]["versions"]:
        root = version["schema"]["openAPIV3Schema"]
        root["properties"]["spec"] = copy.deepcopy(spec)
        problems = schema_problems(root, f"{version['name']}/openAPIV3Schema")
        if problems:
            raise CrdSchemaError(f"the generated Queue CRD is not a structural schema: {'; '.join(problems)}")
    return crd


def crd_text(crd: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(crd, sort_keys=False, width=100, allow_unicode=True)


def generated_text(path: Path | None = None) -> str:
    """What the CRD file should hold: its own parts as they are, the spec schema generated."""
    path = path or crd_path()
    current = yaml.safe_load(path.read_text(encoding="utf-8"))
    return crd_text(crd_document(current, spec_schema()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m queueplane.deploy.crd_schema", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed CRD differs from the generated one"
    )
    args = parser.parse_args(argv)
    path = crd_path()
    try:
        text = generated_text(path)
    except CrdSchemaError as exc:
        print(f"{schema_path()}: {exc}", file=sys.stderr)
        return 1
    if path.read_text(encoding="utf-8") == text:
        print(f"{path}: up to date with specs/queue-v1.schema.json")
        return 0
    if args.check:
        print(
            f"{path}: stale: its spec schema differs from specs/queue-v1.schema.json's; run `make crd`", file=sys.stderr
        )
        return 1
    path.write_text(text, encoding="utf-8")
    print(f"{path}: spec schema regenerated from specs/queue-v1.schema.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
