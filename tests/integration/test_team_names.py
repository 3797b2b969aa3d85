"""Every name a spec touches belongs to its team, against the broker with its authorizer on.

A spec no platform file governs is refused by every command that acts; an output topic of
another team takes a queue's outputs only when that team's spec lists the writer; a group id
belongs to the queue apply first claimed it for. Each refusal leaves the cluster as it was:
no topic, no ACL, no claim.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from helpers import run_cli
from specs_factory import dump, set_path, spec

from queueplane.errors import EXIT_INVALID, EXIT_REFUSED
from queueplane.kafka import clients
from queueplane.kafka.owners import GROUP_KEY, read_records
from queueplane.kafka.target import KafkaTarget

pytestmark = pytest.mark.kafka


def _config(tmp_path: Path, target: KafkaTarget) -> list[str]:
    """The CLI's flags for the broker's super user (the platform's credentials)."""
    path = tmp_path / "admin.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in target.settings.items()))
    return ["--kafka-config", str(path)]


def _write_acls(target: KafkaTarget, principal: str) -> set[str]:
    """The topics ``principal`` may WRITE."""
    wanted = AclBindingFilter(
        ResourceType.TOPIC, None, ResourcePatternType.ANY, principal, None, AclOperation.WRITE, AclPermissionType.ALLOW
    )
    admin = clients.admin(target)  # kept until the answer is in: a dropped client cancels it
    return {b.name for b in admin.describe_acls(wanted).result()}


def _produce(target: KafkaTarget, topic: str) -> str:
    """ "ok", or the error's name."""
    said: list[str] = []
    producer = Producer({**target.settings, "message.timeout.ms": 8000})
    producer.produce(topic, b"v", on_delivery=lambda err, _m: said.append(err.name() if err else "ok"))
    producer.flush(15)
    return said[0] if said else "no answer"


def _topics(target: KafkaTarget, tag: str) -> set[str]:
    admin = clients.admin(target)
    return {t for t in admin.list_topics(timeout=10).topics if tag in t}


def _repository(tmp_path: Path, tag: str) -> Path:
    """A spec repository (a clone: it has .git) whose platform file governs queues/teams/ only.

    Not ``specs/``: its records would name ``specs/teams/...``, which a reconcile DAG's copy of
    another ``specs`` folder (tests/airflow, on the same broker) would count as its own removed specs.
    """
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    platform = {
        "apiVersion": "queueplane.io/v1",
        "kind": "Platform",
        "teams": {
            "cafe": {"topicPrefixes": [f"{tag}.cafe."], "groupPrefixes": [f"{tag}-cafe-"]},
            "payments": {"topicPrefixes": [f"{tag}.payments."], "groupPrefixes": [f"{tag}-payments-"]},
        },
    }
    (repo / "queues" / "teams").mkdir(parents=True)
    (repo / "queues" / "teams" / "platform.yaml").write_text(yaml.safe_dump(platform))
    return repo


def _put(repo: Path, folder: str, doc: dict) -> Path:
    path = repo / "queues" / folder / f"{doc['metadata']['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(doc))
    return path


def _ledger(tag: str, producers: list[str]) -> dict:
    doc = spec("consumer", name="ledger", group=f"{tag}-payments-ledger", topic=f"{tag}.payments.ledger")
    set_path(doc, "spec/processing/exactlyOnce", False)
    set_path(doc, "spec/access", {"worker": f"User:pay-{tag}", "producers": producers})
    return doc


def _orders(tag: str, output: str) -> dict:
    doc = spec("consumer", name="orders", group=f"{tag}-cafe-orders", topic=f"{tag}.cafe.orders")
    set_path(doc, "metadata/team", "cafe")
    set_path(doc, "spec/processing/exactlyOnce", False)
    set_path(doc, "spec/processing/output", {"topic": output})
    set_path(doc, "spec/access", {"worker": f"User:cafe-{tag}"})
    return doc


def test_a_spec_no_platform_file_governs_is_refused_by_every_command_and_changes_nothing(
    secure_kafka, tmp_path, cli_env
):
    """The new-team folder: team payments, its topic, kube-system, beside the governed folder."""
    tag = uuid.uuid4().hex[:8]
    repo = _repository(tmp_path, tag)
    doc = spec("share", name="events", group=f"{tag}-payments-events", topic=f"{tag}.payments.events")
    set_path(doc, "metadata/team", "payments")
    set_path(doc, "spec/deployment/namespace", "kube-system")
    stray = _put(repo, "newteam", doc)
    config = _config(tmp_path, secure_kafka.admin)

    for command in (
        ["validate", str(stray)],
        ["plan", str(stray), *config],
        ["apply", str(stray), "--yes", *config],
        ["deploy", str(stray), "--kubeconfig", str(tmp_path / "never-read")],
    ):
        result = run_cli(command, cli_env)
        said = result.stdout + result.stderr
        assert result.returncode == EXIT_INVALID, (command[0], said)
        assert f"{stray}: /metadata/team: the spec sits outside every platform file's folder" in said, said
        assert "Traceback" not in said
    assert _topics(secure_kafka.admin, tag) == set()


def test_outputs_to_another_teams_topic_need_its_listing_and_a_group_stays_with_its_queue(
    secure_kafka, tmp_path, cli_env
):
    tag = uuid.uuid4().hex[:8]
    repo = _repository(tmp_path, tag)
    config = _config(tmp_path, secure_kafka.admin)
    ledger = _put(repo, "teams/payments", _ledger(tag, producers=[]))
    assert run_cli(["apply", str(ledger), "--yes", *config], cli_env).returncode == 0
    orders = _put(repo, "teams/cafe", _orders(tag, output=f"{tag}.payments.ledger"))
    cafe_worker = secure_kafka.user(f"cafe-{tag}")

    # Not listed: refused before anything reaches the cluster.
    for command in (["validate", str(orders)], ["apply", str(orders), "--yes", *config]):
        refused = run_cli(command, cli_env)
        assert refused.returncode == EXIT_INVALID, refused.stdout + refused.stderr
        assert "/spec/processing/output/topic" in refused.stderr
        assert f"does not list this queue's worker (User:cafe-{tag})" in refused.stderr
    assert _write_acls(secure_kafka.admin, f"User:cafe-{tag}") == set()
    assert _topics(secure_kafka.admin, f"{tag}.cafe") == set()
    assert _produce(cafe_worker, f"{tag}.payments.ledger") == "TOPIC_AUTHORIZATION_FAILED"

    # The payments team lists the cafe worker: apply grants it, and the broker lets it write.
    _put(repo, "teams/payments", _ledger(tag, producers=[f"User:cafe-{tag}"]))
    assert run_cli(["apply", str(ledger), "--yes", *config], cli_env).returncode == 0
    applied = run_cli(["apply", str(orders), "--yes", *config], cli_env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"{tag}.payments.ledger" in _write_acls(secure_kafka.admin, f"User:cafe-{tag}")
    assert _produce(cafe_worker, f"{tag}.payments.ledger") == "ok"

    # A spec outside the repository (no team rules: a scratch checkout) meets the cluster's records:
    # the ledger's group belongs to its queue, and its topic takes outputs only from listed writers.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    thief = spec("consumer", name="thief", group=f"{tag}-payments-ledger", topic=f"{tag}.scratch.thief")
    set_path(thief, "metadata/team", "intruders")
    set_path(thief, "spec/processing/exactlyOnce", False)
    set_path(thief, "spec/processing/output", {"topic": f"{tag}.payments.ledger"})
    set_path(thief, "spec/access", {"worker": f"User:thief-{tag}"})
    path = scratch / "thief.yaml"
    path.write_text(dump(thief))
    planned = run_cli(["plan", str(path), "-o", "json", *config], cli_env)
    assert planned.returncode == EXIT_REFUSED, planned.stderr
    refusals = {c["kind"]: c["reason"] for c in json.loads(planned.stdout)["changes"] if c["action"] == "refuse"}
    assert refusals["group"].startswith(f"the group belongs to queue payments/ledger ({ledger})"), refusals
    assert f"does not list this queue's worker (User:thief-{tag})" in refusals["topic"], refusals
    refused = run_cli(["apply", str(path), "--yes", *config], cli_env)
    assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
    assert _topics(secure_kafka.admin, f"{tag}.scratch") == set()
    assert _write_acls(secure_kafka.admin, f"User:thief-{tag}") == set()
    claims = {k: v["queue"] for k, v in read_records(secure_kafka.admin).items() if k.startswith(GROUP_KEY + tag)}
    assert claims == {
        GROUP_KEY + f"{tag}-payments-ledger": "payments/ledger",
        GROUP_KEY + f"{tag}-cafe-orders": "cafe/orders",
    }
