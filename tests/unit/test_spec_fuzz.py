"""Arbitrary mutations of valid specs end as a valid spec or as validation problems, never as
any other exception: whatever a team commits, the user sees a message, not a traceback."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specs_factory import BASES, dump

from queueplane.errors import Problem
from queueplane.provision.plan import desired_state
from queueplane.spec.rules import check_text

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8,
)
# Plausible values too, so mutations also reach the semantic rules, not only the schema.
plausible = st.sampled_from(
    [
        "share",
        "consumer",
        "kmq",
        "key",
        "partition",
        "none",
        "0s",
        "1ms",
        "30s",
        "2m",
        "1h",
        "1d",
        "a.b:c",
        "x",
        "orders",
        "orders.dlq",
        "latest",
        "earliest",
        "1g",
        "reg/img:1",
        "img:latest",
        0,
        1,
        2,
        5,
        1000,
        10**6,
        True,
        False,
        {},
        [],
    ]
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            out += _paths(child, (*prefix, key))
    return out


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    def value() -> Any:
        # A copy: ``plausible`` holds one {} and one [], and an "add" into the doc would fill
        # that shared {} for every later example (hypothesis then saw its draws change).
        return copy.deepcopy(draw(json_values | plausible))

    doc = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["set", "delete", "add", "rename"]))
        parent: Any = doc
        for part in path[:-1]:
            parent = parent[part]
        if not path:
            if op == "set":
                doc = value()
                if not isinstance(doc, dict):
                    return doc
            continue
        key = path[-1]
        if not isinstance(parent, dict):
            continue
        if op == "set":
            parent[key] = value()
        elif op == "delete":
            parent.pop(key, None)
        elif op == "add" and isinstance(parent.get(key), dict):
            parent[key][draw(st.text(min_size=1, max_size=10))] = value()
        elif op == "rename":
            parent[key + draw(st.sampled_from(["s", "_", "X"]))] = parent.pop(key)
    return doc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_mutated_specs_only_ever_fail_as_validation_problems(doc):
    loaded = check_text(dump(doc), "fuzz.yaml")
    assert all(isinstance(p, Problem) for p in loaded.problems)
    for problem in loaded.problems:
        assert problem.file == "fuzz.yaml"
        assert problem.pointer == "" or problem.pointer.startswith("/")
        assert "\n" not in problem.render()
    if not loaded.problems:
        (queue,) = loaded.queues
        topics, _groups = desired_state([queue])
        assert topics


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(BASES)), st.data())
def test_corrupted_yaml_text_only_fails_as_validation_problems(kind, data):
    text = dump(BASES[kind])
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 5))
        insert = data.draw(st.text(alphabet=":-[]{}&*!|>'\"%@` \n\t#,?", max_size=3))
        text = text[:pos] + insert + text[pos + cut :]
    loaded = check_text(text, "fuzz.yaml")
    assert loaded.problems or loaded.queues
