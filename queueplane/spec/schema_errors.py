"""JSON Schema errors as problems a team can act on: one line per field, with its pointer.

Shared by the queue spec and the platform file, so both read alike.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from queueplane.errors import Problem
from queueplane.spec.files import SpecFile, pointer
from queueplane.spec.schema import SCHEMA_FILE_NAME, load_schema, subschema_at

if TYPE_CHECKING:
    from jsonschema._utils import Unset  # what the stubs say an error's unset field holds

_T = TypeVar("_T")


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """The schema with each local $ref replaced by allOf its target: same meaning, no lookups.

    Reference resolution was most of the validation time when planning hundreds of specs.
    """
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _inline_refs(v, defs) for k, v in node.items() if k not in ("$ref", "$defs")}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        out["allOf"] = [*out.get("allOf", []), _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)]
    return out


@cache
def _validator(name: str) -> Draft202012Validator:
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(_inline_refs(schema, schema["$defs"]))


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_WORDS = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def _given(value: _T | Unset) -> _T:
    """A field of a ValidationError that ``iter_errors`` yielded: the validator's keyword, its value
    in the schema, and the instance. Every error a validator yields has them; jsonschema types them
    ``| Unset`` for an error constructed without them, which this module never sees."""
    return cast(_T, value)


def _schema_error_problems(error: ValidationError, spec: SpecFile, name: str) -> list[Problem]:
    """Turn one jsonschema error into messages a team can act on, with the field's pointer."""
    path = list(error.absolute_path)
    ptr = pointer(path)
    kind, expected, instance = _given(error.validator), _given(error.validator_value), _given(error.instance)
    schema = error.schema if isinstance(error.schema, dict) else {}  # a bool schema has no fields
    custom = schema.get("errorMessage")

    if kind == "additionalProperties" and isinstance(instance, dict):
        known = sorted((schema.get("properties") or {}).keys())
        problems = []
        for key in sorted(set(instance) - set(known), key=str):
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            suggestion = f'did you mean "{close[0]}"?' if close else f"known fields here: {', '.join(known)}"
            problems.append(spec.problem(pointer([*path, key]), f'unknown field "{key}"', suggestion))
        return problems
    if kind == "required" and isinstance(instance, dict):
        missing = [k for k in expected if k not in instance]
        out = []
        for key in missing:
            described = subschema_at([*path, key], name) or {}
            hint = described.get("description")
            out.append(spec.problem(pointer([*path, key]), "is required", hint))
        return out
    if "propertyNames" in error.schema_path:
        # jsonschema reports a bad key at its mapping; point at the key itself.
        return [spec.problem(pointer([*path, instance]), f"{custom or error.message}; got {_show(instance)}")]
    if kind == "enum":
        choices = ", ".join(str(c) for c in expected)
        close = difflib.get_close_matches(str(instance), [str(c) for c in expected], n=1, cutoff=0.5)
        hint = f'did you mean "{close[0]}"?' if close else None
        return [spec.problem(ptr, f"must be one of {choices}; got {_show(instance)}", hint)]
    if kind == "const":
        return [spec.problem(ptr, f"must be {_show(expected)}; got {_show(instance)}")]
    if kind == "type":
        wanted: list[str] = expected if isinstance(expected, list) else [expected]
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in wanted)
        detail = f"must be {words}; got {_show(instance)}"
        if custom and "string" in wanted:
            detail += f" ({custom.removeprefix('must be ')})"
        return [spec.problem(ptr, detail)]
    if kind == "pattern":
        return [spec.problem(ptr, f"{custom or 'must match ' + expected}; got {_show(instance)}")]
    if kind == "not":
        # A value the pattern admits and the field still refuses (a topic named "." or "..").
        return [spec.problem(ptr, f"{custom or 'is not allowed here'}; got {_show(instance)}")]
    if kind in ("minimum", "maximum"):
        word = "at least" if kind == "minimum" else "at most"
        return [spec.problem(ptr, f"must be {word} {expected}; got {_show(instance)}")]
    if kind in ("minLength", "maxLength"):
        word = "at least" if kind == "minLength" else "at most"
        extra = ""
        if path == ["metadata", "name"] and kind == "maxLength":
            extra = " (it becomes the Helm release name)"
        return [spec.problem(ptr, f"must be {word} {expected} characters{extra}; got {len(instance)}")]
    return [spec.problem(ptr, error.message)]


def schema_problems(spec: SpecFile, name: str = SCHEMA_FILE_NAME) -> list[Problem]:
    """Every place the file breaks its schema (the queue spec's unless ``name`` says another)."""
    problems: list[Problem] = []
    errors = sorted(
        _validator(name).iter_errors(spec.data), key=lambda e: (list(map(str, e.absolute_path)), e.validator)
    )
    for error in errors:
        problems.extend(_schema_error_problems(error, spec, name))
    # One field can fail two keywords (type and pattern); keep one line per pointer and message.
    unique: dict[tuple[str, str], Problem] = {}
    for p in problems:
        unique.setdefault((p.pointer, p.message), p)
    return list(unique.values())
