"""One kind, one schema: the Queue CRD's spec schema is the spec file's, generated and structural.

The committed CRD must be what the generator makes from specs/queue-v1.schema.json today; it
must be a schema Kubernetes accepts (structural, apiextensions v1 rules, and the pinned
CustomResourceDefinition API); every spec queueplane accepts must be a Queue the CRD accepts,
and what the CRD can say it refuses as the spec check does.
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from helpers import EXAMPLE_SPECS, EXAMPLES
from hypothesis import HealthCheck, given, settings
from specs_factory import BASES, dump
from test_spec_fuzz import mutated_specs

from queueplane.deploy import crd_schema
from queueplane.deploy.crd_schema import CrdSchemaError, convert, crd_path, generated_text
from queueplane.deploy.definitions import DIGEST_ANNOTATION, definition_digest, stamped
from queueplane.deploy.kube_schema import object_problems
from queueplane.deploy.render import chart_cluster_objects, chart_crds, chart_kinds, render
from queueplane.deploy.structural import schema_problems
from queueplane.provision import steps
from queueplane.spec.rules import check_text
from queueplane.spec.schema import load_schema


def _crd() -> dict:
    (crd,) = chart_crds()
    return crd


def _root() -> dict:
    return _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _as_queue(spec: dict, name: str = "q") -> dict:
    return {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    }


def _pointers(node: dict, at: str = "") -> set[str]:
    """Every property path a schema declares, $refs followed (the spec schema's $defs)."""
    defs = load_schema()["$defs"]
    while "$ref" in node:
        node = {**defs[node["$ref"].removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}}
    found = set()
    for name, sub in (node.get("properties") or {}).items():
        found |= {f"{at}/{name}"} | _pointers(sub, f"{at}/{name}")
    if isinstance(node.get("items"), dict):
        found |= _pointers(node["items"], f"{at}/*")
    return found


def test_the_committed_crd_is_what_the_generator_makes_from_the_spec_schema():
    assert crd_path().read_text() == generated_text(), "stale: run `make crd` and commit the CRD"
    assert crd_schema.main(["--check"]) == 0


def test_a_changed_spec_schema_makes_the_committed_crd_stale(tmp_path, monkeypatch):
    schema = copy.deepcopy(load_schema())
    schema["properties"]["spec"]["properties"]["topic"]["properties"]["partitions"]["maximum"] = 20000
    monkeypatch.setattr(crd_schema, "load_schema", lambda: schema)
    assert crd_path().read_text() != generated_text()
    assert crd_schema.main(["--check"]) == 1
    monkeypatch.undo()
    assert crd_path().read_text() == generated_text(), "--check wrote nothing"


def test_the_crd_declares_every_field_of_the_spec_and_no_defaults():
    assert _pointers(_root()["properties"]["spec"]) == _pointers(load_schema()["properties"]["spec"])
    assert "default:" not in yaml.safe_dump(_root()["properties"]["spec"]), "the object holds the spec as written"


def test_the_crd_is_a_structural_schema_kubernetes_accepts():
    assert schema_problems(_root()) == []
    assert object_problems(_crd()) == [], "against the pinned CustomResourceDefinition API, strictly"
    assert not re.search(r"\(\?[=!<]", crd_path().read_text()), "RE2 has no lookaround"


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (lambda s: s["properties"]["topic"].update({"$ref": "#/x"}), "/properties/topic/$ref: $ref is not supported"),
        (lambda s: s["properties"]["topic"].pop("type"), "/properties/topic/type: must not be empty"),
        (lambda s: s["properties"]["topic"].update(type=["object", "null"]), "/properties/topic/type:"),
        (lambda s: s["properties"]["topic"].update(additionalProperties=False), "mutually exclusive"),
        (lambda s: s["properties"]["access"]["properties"]["producers"].update(uniqueItems=True), "uniqueItems"),
        (lambda s: s["properties"]["group"]["properties"]["id"].update(pattern="^(?!x)a$"), "RE2 has none"),
        (
            lambda s: s["properties"]["group"]["properties"]["id"].update(errorMessage="x"),
            "not a field of JSONSchemaProps",
        ),
        (lambda s: s["properties"]["topic"].update(patternProperties={"a": {}}), "patternProperties is not supported"),
        (lambda s: s["properties"]["topic"]["properties"]["name"]["not"].update(type="string"), "logical junctor"),
        (lambda s: s["properties"]["access"]["properties"]["producers"].pop("items"), "needs one items schema"),
    ],
)
def test_the_structural_check_refuses_what_the_api_server_refuses(mutate, says):
    root = copy.deepcopy(_root())
    mutate(root["properties"]["spec"])
    problems = schema_problems(root)
    assert any(says in problem for problem in problems), problems


def test_the_root_leaves_metadata_to_kubernetes():
    root = copy.deepcopy(_root())
    root["properties"]["metadata"]["properties"] = {"team": {"type": "string"}}
    assert schema_problems(root) == [
        "openAPIV3Schema/properties/metadata: must not specify anything other than name and generateName (found team)"
    ]


def test_the_generator_converts_what_structural_schemas_cannot_say():
    defs = {"label": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 63, "errorMessage": "a label"}}
    converted = convert(
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "kind": {"const": "Queue"},
                "name": {"$ref": "#/$defs/label", "maxLength": 53, "description": "mine"},
                "mode": {"enum": ["a", "b"], "default": "a"},
                "port": {"type": ["string", "integer"]},
                "any": {"type": ["string", "integer", "boolean"]},
                "names": {"type": "array", "items": {"$ref": "#/$defs/label"}, "uniqueItems": True},
                "labels": {
                    "type": "object",
                    "propertyNames": {"pattern": "^x"},
                    "additionalProperties": {"type": "string"},
                },
                "low": {"type": "integer", "exclusiveMinimum": 0},
            },
        },
        defs,
    )
    assert converted == {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["Queue"]},
            "name": {"type": "string", "description": "mine", "pattern": "^[a-z]+$", "maxLength": 53},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "port": {"x-kubernetes-int-or-string": True},
            "any": {"x-kubernetes-preserve-unknown-fields": True},
            "names": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 63},
                "x-kubernetes-list-type": "set",
            },
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "low": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
        },
    }
    assert schema_problems({"type": "object", "properties": {"spec": converted}}) == []


@pytest.mark.parametrize(
    ("node", "pointer"),
    [
        ({"type": "object", "if": {"required": ["a"]}}, "/properties/spec/if"),
        ({"type": "object", "patternProperties": {"^a": {"type": "string"}}}, "/properties/spec/patternProperties"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "/properties/spec/properties/a/$ref"),
        ({"type": "object", "properties": {"a": {"description": "untyped"}}}, "/properties/spec/properties/a:"),
        ({"type": "string", "not": {"type": "string", "enum": ["."]}}, "/properties/spec/not/type"),
    ],
)
def test_the_generator_stops_at_what_it_cannot_convert_naming_the_pointer(node, pointer):
    with pytest.raises(CrdSchemaError, match=re.escape(pointer)):
        convert(node, {})


def _specs_queueplane_accepts() -> list[dict]:
    specs = [yaml.safe_load(path.read_text()) for path in EXAMPLE_SPECS]
    specs += [copy.deepcopy(base) for base in BASES.values()]
    everything = copy.deepcopy(BASES["share"])
    everything["spec"]["topic"]["config"] = {"cleanup.policy": "compact", "min.compaction.lag.ms": 0, "x.y": True}
    everything["spec"]["access"] = {"worker": "User:kitchen", "producers": ["User:till", "User:web"]}
    everything["spec"]["processing"] |= {"setup": "kitchen.handlers:open", "memoryLimit": "512m"}
    specs.append(everything)
    for doc in specs:
        loaded = check_text(dump(doc), "spec.yaml")
        assert not loaded.problems, loaded.problems
    return specs


def test_every_spec_queueplane_accepts_is_a_queue_the_crd_accepts():
    custom = chart_kinds()
    for doc in _specs_queueplane_accepts():
        assert object_problems(_as_queue(doc["spec"], doc["metadata"]["name"]), custom) == [], doc["metadata"]["name"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_a_mutated_spec_the_spec_check_accepts_is_a_queue_the_crd_accepts(doc):
    loaded = check_text(dump(doc), "fuzz.yaml")
    if not loaded.problems:
        assert object_problems(_as_queue(doc["spec"]), chart_kinds()) == []


@pytest.mark.parametrize(
    ("path", "value", "pointer"),
    [
        ("group/type", "fifo", "/spec/group/type"),
        ("topic/name", "..", "/spec/topic/name"),
        ("topic/name", "orders/v1", "/spec/topic/name"),
        ("topic/partitions", 0, "/spec/topic/partitions"),
        ("group/lockDuration", "soon", "/spec/group/lockDuration"),
        ("processing/handler", "no-colon", "/spec/processing/handler"),
        ("deployment/executor/memory", "2gb", "/spec/deployment/executor/memory"),
        ("deployment/image", "Registry/UPPER", "/spec/deployment/image"),
        ("group/lockDuraton", "30s", "/spec/group"),
        ("colour", "red", "/spec"),
    ],
)
def test_what_the_crd_can_say_it_refuses_as_the_spec_check_does(path, value, pointer):
    doc = copy.deepcopy(BASES["share"])
    node = doc["spec"]
    *parents, last = path.split("/")
    for part in parents:
        node = node[part]
    node[last] = value
    assert [p.pointer for p in check_text(dump(doc), "spec.yaml").problems][:1] == [f"/spec/{path}"]
    problems = object_problems(_as_queue(doc["spec"]), chart_kinds())
    assert any(problem.startswith(f"Queue/q: {pointer}:") for problem in problems), problems


def test_the_printer_columns_read_the_deployed_queue():
    """Every column's path exists on a rendered Queue (or in the status schema the driver fills)."""
    queue = next(
        o
        for o in render(steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]).objects
        if o["kind"] == "Queue"
    )
    status = _root()["properties"]["status"]["properties"]
    shown = {}
    for column in _crd()["spec"]["versions"][0]["additionalPrinterColumns"]:
        parts = [p.replace("\0", ".") for p in column["jsonPath"].removeprefix(".").replace("\\.", "\0").split(".")]
        if parts[0] == "status":
            assert parts[1] in status, column
            continue
        value = queue
        for part in parts:
            value = value.get(part) if isinstance(value, dict) else None
        shown[column["name"]] = value
    assert shown["Team"] == "cafe" and shown["Type"] == "share", shown


def test_the_admission_policy_is_valid_and_matches_writes_of_queues_never_status_reports():
    objects = {o["kind"]: o for o in chart_cluster_objects()}
    assert sorted(objects) == [
        "CustomResourceDefinition",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for obj in objects.values():
        assert object_problems(obj, chart_kinds()) == [], "against the pinned Kubernetes API, strictly"
    policy, binding = objects["ValidatingAdmissionPolicy"], objects["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [_crd()["spec"]["group"]] and rule["resources"] == ["queues"], "not queues/status"
    assert rule["operations"] == ["CREATE", "UPDATE"] and policy["spec"]["failurePolicy"] == "Fail"
    made_by, spec_changes = policy["spec"]["validations"]
    # What the chart writes on every Queue is what the policy asks of one.
    queue = next(
        o
        for o in render(steps.validate([str(EXAMPLES / "cafe" / "coffee-orders.yaml")], None)[0]).objects
        if o["kind"] == "Queue"
    )
    for key in re.findall(r"'([a-z./-]+)' in object\.metadata\.labels", made_by["expression"]):
        assert key in queue["metadata"]["labels"], key
    chart_annotations = {
        "meta.helm.sh/release-name",
        "meta.helm.sh/release-namespace",
        *queue["metadata"]["annotations"],
    }
    for key in re.findall(
        r"'([a-z./-]+)' in object\.metadata\.annotations", made_by["expression"] + spec_changes["expression"]
    ):
        assert key in chart_annotations, key
    for validation in (made_by, spec_changes):
        assert validation["reason"] == "Forbidden"
        assert (
            "run its DAG (queue__<team>__<name>)" in validation["message"]
            and "queueplane deploy SPEC" in validation["message"]
        )


def test_the_deploy_writes_each_definition_with_the_digest_of_the_charts_copy():
    crd = _crd()
    body = stamped(crd)
    assert body["metadata"]["annotations"] == {DIGEST_ANNOTATION: definition_digest(crd)}
    assert "annotations" not in crd["metadata"], "the chart's copy is left as it is"
    changed = copy.deepcopy(crd)
    changed["spec"]["versions"][0]["additionalPrinterColumns"].pop()
    assert definition_digest(changed) != definition_digest(crd) == definition_digest(copy.deepcopy(crd))


def test_the_crd_checks_less_than_the_spec_check_only_where_loosened_says():
    def anything_goes(node: dict, at: str = "") -> set[str]:
        found = {at} if node.get("x-kubernetes-preserve-unknown-fields") else set()
        for name, sub in (node.get("properties") or {}).items():
            found |= anything_goes(sub, f"{at}/{name}")
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), dict):
                found |= anything_goes(node[key], f"{at}/*")
        return found

    spec = _root()["properties"]["spec"]
    assert {pointer.removesuffix("/*") for pointer in anything_goes(spec)} == set(crd_schema.LOOSENED)
