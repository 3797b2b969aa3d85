"""Access to the queue spec JSON Schema.

The schema files in ``specs/`` are the single source of truth for the shape of a spec (and
of the platform file), their defaults and field descriptions; everything else reads them
from here.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from queueplane.paths import shipped_file

SCHEMA_FILE_NAME = "queue-v1.schema.json"
PLATFORM_SCHEMA_FILE_NAME = "platform-v1.schema.json"
API_VERSION = "queueplane.io/v1"


def schema_path(name: str = SCHEMA_FILE_NAME) -> Path:
    """Where a schema is: the repository's specs/ in a checkout, else the wheel's copy."""
    return shipped_file(f"specs/{name}")


@cache
def load_schema(name: str = SCHEMA_FILE_NAME) -> dict[str, Any]:
    """The queue spec's schema, or another of specs/ by file name (the platform file's)."""
    return json.loads(schema_path(name).read_text(encoding="utf-8"))


def resolve(node: dict[str, Any], name: str = SCHEMA_FILE_NAME) -> dict[str, Any]:
    """Follow a local ``$ref`` (one level is all the schemas use), merging sibling keywords."""
    ref = node.get("$ref")
    if not ref:
        return node
    target: Any = load_schema(name)
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    merged = dict(target)
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def subschema_at(path: list[str | int], name: str = SCHEMA_FILE_NAME) -> dict[str, Any] | None:
    """The (resolved) schema that governs the value at ``path``, or None if the path is not described."""
    node = resolve(load_schema(name), name)
    for part in path:
        if isinstance(part, int):
            items = node.get("items")
            if not isinstance(items, dict):
                return None
            node = resolve(items, name)
            continue
        props = node.get("properties", {})
        if part in props:
            node = resolve(props[part], name)
        elif isinstance(node.get("additionalProperties"), dict):
            node = resolve(node["additionalProperties"], name)
        else:
            return None
    return node


# (key, has default, default, child defaults) for each property of an object schema
_DefaultsTree = list[tuple[str, bool, Any, "_DefaultsTree | None"]]


def _defaults_tree(node: dict[str, Any]) -> _DefaultsTree | None:
    node = resolve(node)
    if "properties" not in node:
        return None
    tree: _DefaultsTree = []
    for key, child in node["properties"].items():
        child = resolve(child)
        tree.append((key, "default" in child, child.get("default"), _defaults_tree(child)))
    return tree


@cache
def _compiled_defaults() -> _DefaultsTree | None:
    return _defaults_tree(load_schema())


def apply_defaults(document: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of a schema-valid document with every schema default filled in.

    Defaults live only in the schema so that editors, docs and the runtime agree.
    """

    def fill(value: Any, tree: _DefaultsTree | None) -> Any:
        if tree is None or not isinstance(value, dict):
            return value
        out = dict(value)
        for key, has_default, default, child in tree:
            if key not in out and has_default:
                out[key] = copy.deepcopy(default)
            if key in out:
                out[key] = fill(out[key], child)
        return out

    return fill(document, _compiled_defaults())
