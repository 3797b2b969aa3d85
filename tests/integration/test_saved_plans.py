"""Saved plans against the real broker: `plan --out FILE` then `apply FILE` applies exactly that
plan, and refuses, changing nothing, once the specs or the cluster moved since it was made."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from helpers import run_cli
from specs_factory import dump, spec

from queueplane.errors import EXIT_INVALID, EXIT_OK, EXIT_STALE

pytestmark = pytest.mark.kafka


def _queue(tmp_path: Path, tag: str) -> Path:
    path = tmp_path / f"p-{tag}.yaml"
    path.write_text(dump(spec("consumer", name=f"p-{tag}", group=f"gp-{tag}", topic=f"{tag}.saved")))
    return path


def _topics(kafka, tag: str) -> set[str]:
    return {t for t in AdminClient(dict(kafka.settings)).list_topics(timeout=10).topics if t.startswith(tag)}


def _plan(kafka, cli_env, spec_path: Path, plan_file: Path, flag: str = "--out") -> None:
    made = run_cli(["plan", str(spec_path), flag, str(plan_file), "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert made.returncode == EXIT_OK, made.stderr
    assert "Plan: 3 to create, 2 to change, 0 refused." in made.stdout


def _apply(kafka, cli_env, plan_file: Path):
    return run_cli(["apply", str(plan_file), "--bootstrap-servers", kafka.bootstrap], cli_env)


def test_a_saved_plan_applies_exactly_what_was_planned_without_asking(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    plan_file = tmp_path / "plan.json"
    _plan(kafka, cli_env, _queue(tmp_path, tag), plan_file, flag="-out")
    saved = json.loads(plan_file.read_text())
    assert {c["target"] for c in saved["plan"]["changes"] if c["kind"] == "topic"} == {
        f"{tag}.saved",
        f"{tag}.saved.dlq",
    }
    assert _topics(kafka, tag) == set(), "plan changes nothing"

    applied = _apply(kafka, cli_env, plan_file)  # no terminal, no --yes: the saved plan was the approval
    assert applied.returncode == EXIT_OK, applied.stderr
    assert "Apply complete: 3 created, 2 changed." in applied.stdout
    assert _topics(kafka, tag) == {f"{tag}.saved", f"{tag}.saved.dlq"}

    # Applied, the cluster is no longer what the plan read: the same file is refused, not re-run.
    again = _apply(kafka, cli_env, plan_file)
    assert again.returncode == EXIT_STALE, again.stderr
    assert "the cluster changed since the plan was made" in again.stderr


def test_a_saved_plan_is_refused_after_a_concurrent_change_and_nothing_is_applied(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    plan_file = tmp_path / "plan.json"
    _plan(kafka, cli_env, _queue(tmp_path, tag), plan_file)
    # Someone creates the queue's DLQ topic by hand between plan and apply.
    admin = AdminClient(dict(kafka.settings))
    admin.create_topics([NewTopic(f"{tag}.saved.dlq", 1, 1)])[f"{tag}.saved.dlq"].result()

    refused = _apply(kafka, cli_env, plan_file)
    assert refused.returncode == EXIT_STALE, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert str(plan_file) in lines[0] and "Nothing was changed" in lines[0]
    assert _topics(kafka, tag) == {f"{tag}.saved.dlq"}, "the queue's topic was not created"


def test_a_saved_plan_is_refused_once_its_spec_changed_or_with_a_config_changed_live(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    spec_path = _queue(tmp_path, tag)
    plan_file = tmp_path / "plan.json"
    _plan(kafka, cli_env, spec_path, plan_file)
    spec_path.write_text(spec_path.read_text().replace("partitions: 3", "partitions: 4"))
    edited = _apply(kafka, cli_env, plan_file)
    assert edited.returncode == EXIT_STALE and "the specs changed since the plan was made" in edited.stderr
    assert _topics(kafka, tag) == set()

    # Made again and applied, then planned once more: no changes. A config the plan manages, set
    # by hand meanwhile, makes that empty plan stale too (one it does not read would not).
    _plan(kafka, cli_env, spec_path, plan_file)
    assert _apply(kafka, cli_env, plan_file).returncode == EXIT_OK
    empty = run_cli(["plan", str(spec_path), "--out", str(plan_file), "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert empty.returncode == EXIT_OK and json.loads(plan_file.read_text())["plan"]["changes"] == []
    resource = ConfigResource(ResourceType.TOPIC, f"{tag}.saved", set_config={"max.message.bytes": "2000000"})
    admin = AdminClient(dict(kafka.settings))  # kept: a future fails once its client is collected
    admin.alter_configs([resource])[resource].result()
    stale = _apply(kafka, cli_env, plan_file)
    assert stale.returncode == EXIT_STALE, stale.stderr


def test_a_file_that_is_not_a_plan_or_comes_with_specs_is_a_usage_error(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    spec_path = _queue(tmp_path, tag)
    plan_file = tmp_path / "plan.json"
    _plan(kafka, cli_env, spec_path, plan_file)
    mixed = run_cli(["apply", str(plan_file), str(spec_path), "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert mixed.returncode == EXIT_INVALID and "one saved plan alone" in mixed.stderr
    document = json.loads(plan_file.read_text())
    del document["live_digests"]
    plan_file.write_text(json.dumps(document, indent=2))
    broken = _apply(kafka, cli_env, plan_file)
    assert broken.returncode == EXIT_INVALID and "/live_digests" in broken.stderr, broken.stderr
    assert _topics(kafka, tag) == set()
