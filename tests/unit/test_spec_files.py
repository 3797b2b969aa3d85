"""Problems that span files or come from YAML itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from specs_factory import dump, set_path, spec

from queueplane.errors import UsageError
from queueplane.spec.files import parse_text
from queueplane.spec.rules import ShareBounds, check_files, load_specs


def _check(*docs: tuple[str, dict]) -> list:
    return check_files([parse_text(dump(d), name) for name, d in docs], ShareBounds()).problems


def test_two_specs_cannot_share_a_name_group_or_topic():
    a = spec("share")
    b = spec("share")
    problems = _check(("a.yaml", a), ("b.yaml", b))
    by_pointer = {p.pointer: p for p in problems if p.file == "b.yaml"}
    assert "a.yaml" in by_pointer["/metadata/name"].message
    assert "a.yaml" in by_pointer["/spec/group/id"].message
    assert 'topic "brew.orders.v1" is already owned by a.yaml' in by_pointer["/spec/topic/name"].message
    assert "already owned" in by_pointer["/spec/deadLetter/topic"].message
    assert all(p.file == "b.yaml" for p in problems)


def _kitchen(kind: str, name: str, application: str = "kitchen-workers") -> dict:
    """A queue of team kitchen, deployed like the share base spec, in the given application."""
    doc = spec(kind, name=name, group=f"{name}-workers", topic=f"kitchen.{name}")
    set_path(doc, "metadata/team", "kitchen")
    deployment = {**spec("share")["spec"]["deployment"], "application": application}
    return set_path(doc, "spec/deployment", deployment)


def test_the_queues_of_one_application_agree_on_what_they_share():
    docs = [(f"{k}.yaml", _kitchen(k, f"{k}-orders")) for k in ("share", "consumer", "kmq")]
    assert _check(*docs) == []
    set_path(docs[2][1], "spec/deployment/image", "registry.example.com/kitchen:1.3.0")
    set_path(docs[2][1], "spec/deployment/executor", {"cores": 4, "memory": "2g"})
    set_path(docs[1][1], "spec/deployment/namespace", "bakery")
    problems = {(p.file, p.pointer): p.message for p in _check(*docs)}
    assert set(problems) == {
        ("consumer.yaml", "/spec/deployment/namespace"),
        ("kmq.yaml", "/spec/deployment/image"),
        ("kmq.yaml", "/spec/deployment/executor"),
    }
    assert problems[("kmq.yaml", "/spec/deployment/image")] == (
        'is "registry.example.com/kitchen:1.3.0" here and "registry.example.com/qp/worker:0.1.0" in share.yaml, '
        'which runs in the same worker application "kitchen-workers"'
    )
    assert '"bakery" here and "kitchen" in share.yaml' in problems[("consumer.yaml", "/spec/deployment/namespace")]


def test_a_queue_joins_another_queue_s_application_by_its_name_and_then_agrees_with_it():
    alone = _kitchen("share", "billing", application="billing")
    del alone["spec"]["deployment"]["application"]  # an application of its own, named after the queue
    joining = set_path(_kitchen("consumer", "refunds", application="billing"), "metadata/team", "payments")
    problems = _check(("billing.yaml", alone), ("refunds.yaml", joining))
    assert [(p.file, p.pointer) for p in problems] == [("refunds.yaml", "/metadata/team")]


def test_topic_names_colliding_on_dot_and_underscore():
    a = spec("share", name="a", group="ga", topic="team.orders")
    b = spec("consumer", name="b", group="gb", topic="team_orders")
    problems = _check(("a.yaml", a), ("b.yaml", b))
    assert {(p.file, p.pointer) for p in problems} == {
        ("b.yaml", "/spec/topic/name"),
        ("b.yaml", "/spec/deadLetter/topic"),
    }
    main = next(p for p in problems if p.pointer == "/spec/topic/name")
    assert 'collides with "team.orders" in a.yaml' in main.message


def test_one_specs_dlq_cannot_be_anothers_queue_topic():
    a = spec("share", name="a", group="ga", topic="orders")
    b = spec("consumer", name="b", group="gb", topic="other")
    b["spec"]["deadLetter"] = {"topic": "orders"}
    (problem,) = _check(("a.yaml", a), ("b.yaml", b))
    assert problem.pointer == "/spec/deadLetter/topic"


def test_output_topic_may_be_another_queues_input():
    a = spec("share", name="a", group="ga", topic="orders")
    b = spec("consumer", name="b", group="gb", topic="other")
    b["spec"]["processing"]["output"] = {"topic": "orders"}
    assert _check(("a.yaml", a), ("b.yaml", b)) == []


def test_yaml_syntax_error_has_line_and_column():
    problems = check_files([parse_text("apiVersion: x\nmetadata: {name: [\n", "broken.yaml")], None).problems
    (problem,) = problems
    assert problem.message.startswith("YAML syntax error")
    assert problem.line == 3 and problem.column is not None
    assert problem.render().startswith("broken.yaml: /: YAML syntax error")


def test_duplicate_keys_are_errors_not_silently_merged():
    text = dump(spec("share")).replace("kind: Queue\n", "kind: Queue\nkind: Queue\n")
    (problem,) = check_files([parse_text(text, "d.yaml")], None).problems
    assert problem.pointer == "/kind" and "duplicate key" in problem.message


@pytest.mark.parametrize(("text", "fragment"), [("", "empty"), ("a: 1\n---\nb: 2\n", "2 YAML documents")])
def test_empty_and_multi_document_files(text, fragment):
    (problem,) = check_files([parse_text(text, "f.yaml")], None).problems
    assert fragment in problem.message


def test_top_level_must_be_a_mapping():
    (problem,) = check_files([parse_text("- a\n- b\n", "l.yaml")], None).problems
    assert problem.pointer == "" and "must be a mapping" in problem.message


def test_directories_are_searched_and_missing_paths_are_usage_errors(tmp_path: Path):
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "q.yaml").write_text(dump(spec("share")))
    (tmp_path / "notes.txt").write_text("not a spec")
    loaded = load_specs([str(tmp_path), str(tmp_path / "team" / "q.yaml")])
    assert [q.name for q in loaded.queues] == ["brew-orders"]
    with pytest.raises(UsageError, match="no such file"):
        load_specs([str(tmp_path / "missing")])


def test_a_files_text_is_quoted_as_it_is_never_read_as_console_markup(tmp_path, cli_env):
    from helpers import run_cli

    odd = tmp_path / "passwd.yaml"
    odd.write_text("root:x:0:[b]0[/b]:thumbs_up:/root\n")  # a plain scalar, as /etc/passwd's lines are
    result = run_cli(["validate", str(odd)], cli_env)
    assert result.returncode == 2
    assert 'must be a mapping; got "root:x:0:[b]0[/b]:thumbs_up:/root"' in result.stderr, result.stderr
