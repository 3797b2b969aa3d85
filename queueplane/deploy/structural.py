"""Kubernetes' rules for a CustomResourceDefinition's schema, checked offline.

An API server refuses a CRD whose ``openAPIV3Schema`` is not *structural* or breaks the
apiextensions rules. The Queue CRD's spec schema is generated from the spec's JSON Schema
(crd_schema.py), so these rules are what the generator must meet, checked without a cluster;
they follow apiextensions-apiserver v0.35 (Kubernetes 1.35):
``pkg/apis/apiextensions/validation/validation.go`` (``ValidateCustomResourceDefinitionOpenAPISchema``
and its ``specStandardValidatorV3``) and ``pkg/apiserver/schema/validation.go`` (structurality):

- only the fields of ``JSONSchemaProps``, and never ``$ref``, ``definitions``, ``patternProperties``,
  ``dependencies``, ``additionalItems``, ``id``, ``uniqueItems: true`` or ``type: null``;
- a ``type`` (one word, not a list) at the root, for every property, every
  ``additionalProperties`` schema and every array's ``items``, except where
  ``x-kubernetes-int-or-string`` or ``x-kubernetes-preserve-unknown-fields`` says any value goes;
- an array has one ``items`` schema;
- ``properties`` and ``additionalProperties`` never together, and no ``additionalProperties`` at the root;
- inside ``allOf``, ``anyOf``, ``oneOf`` and ``not``: value checks only (no ``type``,
  ``description``, ``title``, ``default``, ``nullable``, ``additionalProperties`` or
  ``x-kubernetes-*``), and properties the enclosing schema also declares;
- list types: ``set`` of scalars, ``map`` with its keys among the items' required properties;
- with the status subresource, only a few fields at the root, where ``metadata`` may restrict
  nothing but ``name`` and ``generateName``;
- patterns Go's RE2 compiles (no lookaround, backreferences or possessive repeats).
"""

from __future__ import annotations

import re
from typing import Any

# JSONSchemaProps' fields (k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1/types_jsonschema.go).
JSON_SCHEMA_PROPS = frozenset(
    {
        "id",
        "$schema",
        "$ref",
        "description",
        "type",
        "format",
        "title",
        "default",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "enum",
        "maxProperties",
        "minProperties",
        "required",
        "items",
        "allOf",
        "oneOf",
        "anyOf",
        "not",
        "properties",
        "additionalProperties",
        "patternProperties",
        "dependencies",
        "additionalItems",
        "definitions",
        "externalDocs",
        "example",
        "nullable",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-list-type",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)
FORBIDDEN = {
    "id": "id is not supported",
    "$ref": "$ref is not supported",
    "definitions": "definitions is not supported",
    "patternProperties": "patternProperties is not supported",
    "dependencies": "dependencies is not supported",
    "additionalItems": "additionalItems is not supported",
}
TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})
SCALARS = frozenset({"string", "integer", "number", "boolean"})
JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
# What a schema inside a junctor must not set to be structural.
NOT_IN_JUNCTORS = ("type", "description", "title", "default", "nullable", "additionalProperties")
# The root's fields when the status subresource is on (allowedFieldsAtRootSchema).
ROOT_FIELDS = frozenset(
    {
        "description",
        "type",
        "format",
        "title",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "required",
        "items",
        "properties",
        "externalDocs",
        "example",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
    }
)
# Regular-expression constructs Python has and Go's RE2 lacks.
NOT_RE2 = re.compile(r"\(\?[=!]|\(\?<[=!]|\(\?>|\(\?P=|\\[1-9]|[*+?}][+]")


def _any_value(node: dict[str, Any]) -> bool:
    return bool(node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields"))


def _list_type_problems(node: dict[str, Any], where: str) -> list[str]:
    list_type = node.get("x-kubernetes-list-type")
    if list_type is None:
        return []
    if node.get("type") != "array":
        return [f"{where}/x-kubernetes-list-type: only arrays have a list type"]
    items: dict[str, Any] = node["items"] if isinstance(node.get("items"), dict) else {}
    if list_type == "set":
        scalar = isinstance(items.get("type"), str) and items["type"] in SCALARS
        if not scalar and items.get("x-kubernetes-map-type") != "atomic":
            return [f"{where}/items/type: a set's items must be scalars (or atomic maps)"]
        return []
    if list_type == "map":
        keys = node.get("x-kubernetes-list-map-keys") or []
        if not keys or items.get("type") != "object":
            return [f"{where}/x-kubernetes-list-map-keys: a map list needs keys and object items"]
        declared = items.get("properties") or {}
        missing = [k for k in keys if k not in declared]
        loose = [
            k for k in keys if k in declared and k not in (items.get("required") or []) and "default" not in declared[k]
        ]
        if missing or loose:
            return [f"{where}/x-kubernetes-list-map-keys: {(missing or loose)[0]} must be a required item property"]
        return []
    if list_type != "atomic":
        return [f"{where}/x-kubernetes-list-type: {list_type!r} is not atomic, set or map"]
    return []


def _junctor_problems(node: dict[str, Any], outer: dict[str, Any], where: str) -> list[str]:
    """A schema inside allOf/anyOf/oneOf/not: value checks on what the enclosing schema declares."""
    problems = [f"{where}/{k}: must not be set inside a logical junctor" for k in NOT_IN_JUNCTORS if k in node]
    problems += [
        f"{where}/{k}: must not be set inside a logical junctor" for k in node if k.startswith("x-kubernetes-")
    ]
    problems += [f"{where}/{k}: {FORBIDDEN[k]}" for k in node if k in FORBIDDEN]
    problems += [f"{where}/{k}: not a field of JSONSchemaProps" for k in node if k not in JSON_SCHEMA_PROPS]
    declared = outer.get("properties") or {}
    for name, sub in (node.get("properties") or {}).items():
        if name not in declared:
            problems.append(f"{where}/properties/{name}: not declared by the enclosing schema")
        elif isinstance(sub, dict):
            problems += _junctor_problems(sub, declared[name], f"{where}/properties/{name}")
    if isinstance(node.get("items"), dict):
        problems += _junctor_problems(node["items"], outer.get("items") or {}, f"{where}/items")
    for key in JUNCTORS:
        for index, sub in enumerate(_junctor_list(node, key)):
            problems += _junctor_problems(sub, outer, f"{where}/{key}" + ("" if key == "not" else f"/{index}"))
    return problems


def _junctor_list(node: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = node.get(key)
    if value is None:
        return []
    return [value] if key == "not" else list(value)


def schema_problems(node: dict[str, Any], where: str = "openAPIV3Schema", *, root: bool = True) -> list[str]:
    """Why ``node`` (a CRD version's ``openAPIV3Schema``) is no structural schema Kubernetes accepts,
    as 'pointer: reason' lines; empty when it is one."""
    problems = [f"{where}/{k}: not a field of JSONSchemaProps" for k in node if k not in JSON_SCHEMA_PROPS]
    problems += [f"{where}/{k}: {FORBIDDEN[k]}" for k in node if k in FORBIDDEN]
    if node.get("uniqueItems"):
        problems.append(f"{where}/uniqueItems: cannot be true (quadratic); use x-kubernetes-list-type: set")
    kind = node.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in TYPES):  # a list of types, or "null"
        problems.append(f"{where}/type: {kind!r} is not one of {', '.join(sorted(TYPES))} (one word)")
    elif kind is None and not _any_value(node):
        problems.append(f"{where}/type: must not be empty (only int-or-string or preserve-unknown-fields go untyped)")
    if node.get("x-kubernetes-int-or-string") and kind is not None:
        problems.append(f"{where}/type: must be empty with x-kubernetes-int-or-string")
    if root:
        problems += [
            f"{where}/{k}: not allowed at the root with the status subresource" for k in node if k not in ROOT_FIELDS
        ]
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{where}/additionalProperties: properties and additionalProperties are mutually exclusive")
    if kind == "array" and not isinstance(node.get("items"), dict):
        problems.append(f"{where}/items: an array needs one items schema")
    pattern = node.get("pattern")
    if isinstance(pattern, str) and NOT_RE2.search(pattern):
        problems.append(f"{where}/pattern: {pattern!r} uses lookaround, a backreference or a possessive (RE2 has none)")
    problems += _list_type_problems(node, where)
    for name, sub in (node.get("properties") or {}).items():
        problems += schema_problems(sub, f"{where}/properties/{name}", root=False)
    if isinstance(node.get("additionalProperties"), dict):
        problems += schema_problems(node["additionalProperties"], f"{where}/additionalProperties", root=False)
    if isinstance(node.get("items"), dict):
        problems += schema_problems(node["items"], f"{where}/items", root=False)
    for key in JUNCTORS:
        for index, sub in enumerate(_junctor_list(node, key)):
            problems += _junctor_problems(sub, node, f"{where}/{key}" + ("" if key == "not" else f"/{index}"))
    if root:
        problems += _root_problems(node, where)
    return problems


def _root_problems(node: dict[str, Any], where: str) -> list[str]:
    """An object at the root, apiVersion and kind strings, and metadata left to Kubernetes."""
    problems = [f"{where}/type: must be object at the root"] if node.get("type") != "object" else []
    properties = node.get("properties") or {}
    for name in ("apiVersion", "kind"):
        if name in properties and properties[name].get("type") != "string":
            problems.append(f"{where}/properties/{name}/type: must be string")
    metadata = properties.get("metadata")
    if metadata is not None:
        restricted = set(metadata.get("properties") or {}) - {"name", "generateName"}
        extra = set(metadata) - {"type", "properties"}
        if restricted or extra or metadata.get("type", "object") != "object":
            problems.append(
                f"{where}/properties/metadata: must not specify anything other than name and generateName "
                f"(found {', '.join(sorted(restricted | extra)) or 'a type other than object'})"
            )
    return problems
