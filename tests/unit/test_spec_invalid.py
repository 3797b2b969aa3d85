"""Every invalid spec is reported with its file, the JSON pointer of the field and a message
a team can act on; nothing else about the run changes."""

from __future__ import annotations

import pytest
from helpers import run_cli
from specs_factory import DELETE, dump, set_path, spec

from queueplane.spec.rules import check_text

# (base kind, path to change, new value, expected pointer, expected message fragment, expected hint fragment)
CASES = [
    ("share", "apiVersion", "queueplane.io/v2", "/apiVersion", 'must be "queueplane.io/v1"', None),
    ("share", "kind", "Topic", "/kind", 'must be "Queue"', None),
    ("share", "metadata", DELETE, "/metadata", "is required", "Who owns the queue"),
    ("share", "metadata/name", "Brew_Orders", "/metadata/name", "DNS-1123 label", None),
    ("share", "metadata/name", "a" * 60, "/metadata/name", "at most 53 characters (it becomes the Helm release", None),
    ("share", "metadata/team", DELETE, "/metadata/team", "is required", None),
    ("share", "specs", {}, "/specs", 'unknown field "specs"', 'did you mean "spec"'),
    (
        "share",
        "spec/group/lockDuraton",
        "30s",
        "/spec/group/lockDuraton",
        "unknown field",
        'did you mean "lockDuration"',
    ),
    ("share", "spec/topic/name", "orders/v1", "/spec/topic/name", "legal Kafka topic name", None),
    ("share", "spec/topic/name", "..", "/spec/topic/name", "legal Kafka topic name", None),
    ("share", "spec/topic/name", ".", "/spec/topic/name", "legal Kafka topic name", None),
    ("share", "spec/topic/name", "t" * 250, "/spec/topic/name", "legal Kafka topic name", None),
    ("share", "spec/topic/partitions", 0, "/spec/topic/partitions", "must be at least 1; got 0", None),
    ("share", "spec/topic/partitions", "six", "/spec/topic/partitions", 'must be a whole number; got "six"', None),
    ("share", "spec/topic/replicationFactor", 0, "/spec/topic/replicationFactor", "must be at least 1", None),
    ("share", "spec/topic/config/Retention", "1", "/spec/topic/config/Retention", "Kafka topic config name", None),
    (
        "share",
        "spec/topic/config/retention.ms",
        [1],
        "/spec/topic/config/retention.ms",
        "must be a string or a whole number or true or false",
        None,
    ),
    (
        "share",
        "spec/group/type",
        "shared",
        "/spec/group/type",
        "must be one of consumer, share, kmq",
        'did you mean "share"',
    ),
    ("share", "spec/group/id", DELETE, "/spec/group/id", "is required", "Group id"),
    ("share", "spec/group/id", "kitchen service", "/spec/group/id", "letters, digits", None),
    (
        "share",
        "spec/group/lockDuration",
        "30 seconds",
        "/spec/group/lockDuration",
        "must be a duration such as 500ms",
        None,
    ),
    ("share", "spec/group/lockDuration", 30, "/spec/group/lockDuration", "must be a string; got 30 (a duration", None),
    ("consumer", "spec/group/lockDuration", "0s", "/spec/group/lockDuration", "must be longer than 0s", None),
    (
        "share",
        "spec/group/lockDuration",
        "5s",
        "/spec/group/lockDuration",
        "outside the share-group range 15s..1m",
        "group.share.min.record.lock.duration.ms",
    ),
    ("share", "spec/group/lockDuration", "2m", "/spec/group/lockDuration", "outside the share-group range", None),
    (
        "share",
        "spec/group/deliveryLimit",
        10,
        "/spec/group/deliveryLimit",
        "10 is outside the share-group range 1..8",
        None,
    ),
    (
        "share",
        "spec/group/maxInFlight",
        50,
        "/spec/group/maxInFlight",
        "50 is outside the share-group range 100..4000",
        None,
    ),
    ("share", "spec/group/ordering", "key", "/spec/group/ordering", 'must be "none" for share groups', None),
    ("kmq", "spec/group/ordering", "partition", "/spec/group/ordering", 'must be "none" for kmq groups', None),
    (
        "share",
        "spec/processing/exactlyOnce",
        True,
        "/spec/processing/exactlyOnce",
        "only for consumer groups",
        "KIP-447",
    ),
    (
        "share",
        "spec/deadLetter/topic",
        "brew.orders.v1",
        "/spec/deadLetter/topic",
        "must differ from the queue topic",
        None,
    ),
    (
        "share",
        "spec/processing/handler",
        "kitchen.handlers.prepare",
        "/spec/processing/handler",
        "must be module:function",
        None,
    ),
    (
        "share",
        "spec/processing/handler",
        "kitchen:prepare-drink",
        "/spec/processing/handler",
        "must be module:function",
        None,
    ),
    (
        "share",
        "spec/processing/output/topic",
        "brew.orders.v1",
        "/spec/processing/output/topic",
        'must differ from /spec/topic/name "brew.orders.v1"',
        "loop back",
    ),
    ("consumer", "spec/markers", {"retention": "1d"}, "/spec/markers", "applies only to kmq groups", None),
    ("share", "spec/retry", {"backoff": "1s"}, "/spec/retry", "does not apply to share groups", None),
    ("kmq", "spec/markers/retention", "90s", "/spec/markers/retention", "shorter than twice lockDuration (2m)", None),
    ("consumer", "spec/retry/backoff", "10s", "/spec/retry/backoff", "10s is longer than maxBackoff 5s", None),
    ("share", "spec/autoscaling/minExecutors", 20, "/spec/autoscaling/minExecutors", "more than maxExecutors 10", None),
    (
        "share",
        "spec/deployment/image",
        "registry.example.com/qp/worker:latest",
        "/spec/deployment/image",
        "is not pinned",
        None,
    ),
    ("share", "spec/deployment/image", "Registry/Worker:1", "/spec/deployment/image", "image reference", None),
    ("share", "spec/deployment/executor/memory", "2GB", "/spec/deployment/executor/memory", "Spark memory size", None),
    ("share", "spec/deployment/namespace", "Kitchen", "/spec/deployment/namespace", "DNS-1123 label", None),
    (
        "share",
        "spec/deployment/target",
        "yarn",
        "/spec/deployment/target",
        "must be one of kubernetes, spark-submit",
        None,
    ),
    ("share", "spec/processing/concurrency", 0, "/spec/processing/concurrency", "must be at least 1", None),
    ("share", "spec/processing", DELETE, "/spec/processing", "is required", "handler"),
    (
        "share",
        "spec/autoscaling/targetLagSeconds",
        "30s",
        "/spec/autoscaling/targetLagSeconds",
        "must be a whole number",
        None,
    ),
    ("share", "spec/group/startFrom", "beginning", "/spec/group/startFrom", "must be one of earliest, latest", None),
]


@pytest.mark.parametrize(
    ("kind", "path", "value", "pointer", "message", "hint"), CASES, ids=[f"{c[0]}:{c[1]}={c[2]!r:.20}" for c in CASES]
)
def test_invalid_spec_names_field_and_reason(kind, path, value, pointer, message, hint):
    doc = set_path(spec(kind), path, value)
    problems = check_text(dump(doc), "specs/kitchen/brew.yaml").problems
    matching = [p for p in problems if p.pointer == pointer]
    assert matching, f"no problem at {pointer}; got {[p.render() for p in problems]}"
    problem = matching[0]
    assert message in problem.message
    if hint:
        assert hint in (problem.hint or "")
    rendered = problem.render()
    assert rendered.startswith(f"specs/kitchen/brew.yaml: {pointer}: ")
    assert "\n" not in rendered


def test_case_count_meets_the_bar():
    assert len(CASES) >= 30


def test_every_problem_of_a_file_is_reported_in_one_run():
    doc = spec("share")
    set_path(doc, "spec/topic/partitions", 0)
    set_path(doc, "spec/group/type", "queue")
    set_path(doc, "metadata/nmae", "x")
    problems = check_text(dump(doc), "a.yaml").problems
    assert {p.pointer for p in problems} >= {"/spec/topic/partitions", "/spec/group/type", "/metadata/nmae"}


def test_semantic_rules_report_all_at_once():
    doc = spec("share")
    set_path(doc, "spec/group/ordering", "key")
    set_path(doc, "spec/processing/exactlyOnce", True)
    set_path(doc, "spec/group/deliveryLimit", 50)
    pointers = {p.pointer for p in check_text(dump(doc), "a.yaml").problems}
    assert pointers == {"/spec/group/ordering", "/spec/processing/exactlyOnce", "/spec/group/deliveryLimit"}


def test_problem_carries_the_line_of_the_field():
    text = dump(set_path(spec("share"), "spec/group/type", "queue"))
    expected_line = next(i for i, line in enumerate(text.splitlines(), 1) if "type: queue" in line)
    (problem,) = check_text(text, "a.yaml").problems
    assert problem.line == expected_line
    assert f"(line {expected_line})" in problem.render()


BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_an_alias_bomb_is_refused_at_once_with_the_file_named(tmp_path, cli_env):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 500  # expands to 9^9 strings
    result = run_cli(["validate", str(bomb)], cli_env, timeout=30)  # hung for good before the limit
    assert result.returncode == 2
    assert f"{bomb}: /: its YAML aliases expand to more than" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: &a [*a]\n", "refer to themselves"),
        ("spec: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ],
)
def test_recursive_and_deeply_nested_yaml_is_refused(text, message):
    (problem,) = check_text(text).problems
    assert message in problem.message


def test_a_file_far_larger_than_a_spec_is_refused_unread(tmp_path, cli_env):
    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * 40_000)
    result = run_cli(["validate", str(huge)], cli_env)
    assert result.returncode == 2 and f"{huge}: /: the file has 400000 bytes" in result.stderr


def test_anchors_of_ordinary_size_still_work():
    ok = spec("share")
    text = dump(ok).replace("spec:\n", "x-shared: &cores 2\nspec:\n", 1)
    assert all("alias" not in p.message for p in check_text(text).problems)
