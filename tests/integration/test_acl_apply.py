"""Declared access against the local broker with its authorizer on, through its SASL_SSL listener.

Apply grants the spec's principals exactly what they need; the broker then lets the worker
read its queue and write its DLQ and nothing else, and a producer write to the queue only.
A producer dropped from the spec loses its ACL; an ACL someone granted by hand stays; an ACL
apply made and someone deleted is drift that the next plan shows and apply restores.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from helpers import run_cli
from specs_factory import dump, spec

from queueplane.kafka import clients
from queueplane.kafka.limits import largest_record
from queueplane.local.stack import LocalStack

pytestmark = pytest.mark.kafka


def _properties(path, target) -> str:
    path.write_text("".join(f"{k}={v}\n" for k, v in target.settings.items()))
    return str(path)


def _acls(admin_target, principal: str) -> set[str]:
    admin = clients.admin(admin_target)
    wanted = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY, AclPermissionType.ALLOW
    )
    out = set()
    for b in admin.describe_acls(wanted).result():
        resource = "CLUSTER" if b.restype == ResourceType.BROKER else b.restype.name
        star = "*" if b.resource_pattern_type == ResourcePatternType.PREFIXED else ""
        out.add(f"{b.principal} {b.operation.name} {resource}:{b.name}{star}")
    return out


def _produce(target, topic: str) -> str | None:
    """None when the write is acknowledged, else the error's name."""
    errors: list[str] = []
    producer = Producer({**target.settings, "message.timeout.ms": 8000})
    producer.produce(topic, b"v", on_delivery=lambda err, _m: errors.append(err.name() if err else "ok"))
    producer.flush(15)
    return None if errors == ["ok"] else (errors[0] if errors else "no answer")


def _consume_error(target, topic: str, group: str) -> str | None:
    """The error a consumer of ``group`` gets on ``topic`` within a few seconds, or None if it reads."""
    consumer = Consumer({**target.settings, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        for _ in range(20):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                return message.error().name()
            return None
        return "no record"
    finally:
        consumer.close()


def test_apply_grants_the_declared_principals_exactly_their_acls_and_manages_only_its_own(
    secure_kafka, tmp_path, cli_env
):
    tag = uuid.uuid4().hex[:8]
    worker, producer, stranger = (secure_kafka.user(f"{role}-{tag}") for role in ("worker", "till", "stranger"))
    old_producer = secure_kafka.user(f"oldtill-{tag}")
    doc = spec("consumer", name=f"acl-{tag}", group=f"g-{tag}", topic=f"{tag}.payments")
    doc["spec"]["processing"]["exactlyOnce"] = False
    doc["spec"]["access"] = {"worker": f"User:worker-{tag}", "producers": [f"User:till-{tag}", f"User:oldtill-{tag}"]}
    path = tmp_path / "acl.yaml"
    path.write_text(dump(doc))
    config = ["--kafka-config", _properties(tmp_path / "admin.properties", secure_kafka.admin)]

    planned = run_cli(["plan", str(path), *config], cli_env)
    assert planned.returncode == 0, planned.stderr
    assert "+ acl" in planned.stdout and f"User:worker-{tag} READ TOPIC:{tag}.payments" in planned.stdout
    applied = run_cli(["apply", str(path), "--yes", *config], cli_env)
    assert applied.returncode == 0, applied.stderr
    assert _acls(secure_kafka.admin, f"User:worker-{tag}") == {
        f"User:worker-{tag} READ TOPIC:{tag}.payments",
        f"User:worker-{tag} READ GROUP:g-{tag}",
        f"User:worker-{tag} READ GROUP:queueplane-spark:g-{tag}:*",
        f"User:worker-{tag} WRITE TOPIC:{tag}.payments.dlq",
        f"User:worker-{tag} WRITE TOPIC:{tag}.payments",  # parks the dead letters its DLQ refuses
        f"User:worker-{tag} DESCRIBE_CONFIGS CLUSTER:kafka-cluster",
        f"User:worker-{tag} DESCRIBE_CONFIGS TOPIC:{tag}.payments",
        f"User:worker-{tag} DESCRIBE_CONFIGS TOPIC:{tag}.payments.dlq",
    }
    assert run_cli(["plan", str(path), *config], cli_env).stdout.count("No changes.") == 1

    # What the broker now allows.
    topic, dlq = f"{tag}.payments", f"{tag}.payments.dlq"
    assert _produce(producer, topic) is None
    assert _produce(stranger, topic) == "TOPIC_AUTHORIZATION_FAILED"
    assert _produce(worker, dlq) is None
    assert _produce(worker, topic) is None, "the worker parks dead letters its DLQ refuses in its own topic"
    # It reads the sizes of the topics it writes, which its producers are sized from.
    assert largest_record(worker, [topic, dlq]) == 1_048_588 + 64 * 1024  # the DLQ's, raised by apply
    assert _consume_error(worker, topic, f"g-{tag}") is None
    assert _consume_error(worker, topic, f"other-{tag}") == "GROUP_AUTHORIZATION_FAILED"
    assert _consume_error(stranger, topic, f"g-{tag}") in ("TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED")

    # Ops grant the worker one more ACL by hand; then a producer leaves the spec.
    admin = clients.admin(secure_kafka.admin)
    by_hand = AclBinding(
        ResourceType.TOPIC, f"{tag}.audit", ResourcePatternType.LITERAL, f"User:worker-{tag}", "*",
        AclOperation.WRITE, AclPermissionType.ALLOW,
    )  # fmt: skip
    admin.create_acls([by_hand])[by_hand].result()
    doc["spec"]["access"]["producers"] = [f"User:till-{tag}"]
    path.write_text(dump(doc))
    planned = run_cli(["plan", str(path), "-o", "json", *config], cli_env)
    changes = [(c["action"], c["target"]) for c in json.loads(planned.stdout)["changes"] if c["kind"] == "acl"]
    assert changes == [("delete", f"User:oldtill-{tag} WRITE TOPIC:{tag}.payments")]
    assert run_cli(["apply", str(path), "--yes", *config], cli_env).returncode == 0
    assert _acls(secure_kafka.admin, f"User:oldtill-{tag}") == set()
    assert _produce(old_producer, topic) == "TOPIC_AUTHORIZATION_FAILED"
    assert f"User:worker-{tag} WRITE TOPIC:{tag}.audit" in _acls(secure_kafka.admin, f"User:worker-{tag}")

    # Someone deletes one of the worker's ACLs: drift, shown and restored.
    taken = AclBindingFilter(
        ResourceType.GROUP, f"g-{tag}", ResourcePatternType.LITERAL, f"User:worker-{tag}", None,
        AclOperation.READ, AclPermissionType.ALLOW,
    )  # fmt: skip
    admin.delete_acls([taken])[taken].result()
    drift = run_cli(["plan", str(path), *config], cli_env)
    assert "(drift)" in drift.stdout and f"User:worker-{tag} READ GROUP:g-{tag}" in drift.stdout, drift.stdout
    assert run_cli(["apply", str(path), "--yes", *config], cli_env).returncode == 0
    assert f"User:worker-{tag} READ GROUP:g-{tag}" in _acls(secure_kafka.admin, f"User:worker-{tag}")
    assert "No changes." in run_cli(["plan", str(path), *config], cli_env).stdout


def test_a_spec_with_access_on_a_cluster_without_an_authorizer_is_refused(kafka, tmp_path, cli_env):
    # The session broker has an authorizer; a plain one is started for this check.
    stack = LocalStack(tmp_path / "plain")
    state = stack.up()
    try:
        doc = spec("share", name="noauth", group="g-noauth", topic="noauth.orders")
        doc["spec"]["access"] = {"worker": "User:w"}
        path = tmp_path / "noauth.yaml"
        path.write_text(dump(doc))
        result = run_cli(["apply", str(path), "--yes", "--bootstrap-servers", state.bootstrap], cli_env)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "no authorizer" in result.stderr and "nothing was applied" in result.stderr
    finally:
        stack.down(purge=True)
