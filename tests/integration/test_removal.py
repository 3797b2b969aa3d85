"""Removing a spec against the real broker: plan shows what goes, found from the cluster's owner
records, and apply removes it in order; the broker's authorizer then refuses what the removed
queue's principals were granted.

The specs here deploy with spark-submit, which queueplane does not uninstall: a Kubernetes
release's removal (helm uninstall, the Queue object gone) is tests/kubernetes/test_release_removal.py's.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState, TopicPartition
from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType
from helpers import run_cli
from specs_factory import dump, set_path, spec
from test_acl_apply import _acls, _produce, _properties

from queueplane.errors import EXIT_CHANGES, EXIT_FAILED, EXIT_OK, EXIT_STALE
from queueplane.kafka import clients
from queueplane.kafka.names import CONSUMER_HEARTBEAT_INTERVAL_MS, CONSUMER_SESSION_TIMEOUT_MS
from queueplane.kafka.owners import read_records

pytestmark = pytest.mark.kafka


def _doc(tag: str, policy: str = "retain", target: str = "spark-submit", name: str | None = None) -> dict:
    doc = spec("consumer", name=name or f"rm-{tag}", group=f"g-{tag}", topic=f"{tag}.pay")
    doc["spec"]["processing"]["exactlyOnce"] = False
    doc["spec"]["deletionPolicy"] = policy
    if target != "kubernetes":
        set_path(doc, "spec/deployment/target", target)
    return doc


def _write(folder: Path, doc: dict, name: str = "pay.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(dump(doc))
    return path


def _cli(args: list[str], env: dict[str, str], cluster: list[str]):
    return run_cli([*args, *cluster], env)


def _lines(output: str) -> list[str]:
    """The plan's change lines, marks and all, with their runs of spaces made one."""
    return [
        " ".join(line.split()) for line in output.splitlines() if line[:4].strip() in ("+", "=", "~", "-", ">", "!")
    ]


def _records_of(target, queue: str) -> set[str]:
    """The owner record keys that name ``queue``."""
    out = set()
    for key, value in read_records(target).items():
        if key == f"acls:{queue}" or value.get("queue") == queue:
            out.add(key)
    return out


def _commit(target, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = clients.consumer(target, {"group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def _ends(target, topic: str) -> dict[int, int]:
    consumer = clients.consumer(target, {"group.id": f"probe-{uuid.uuid4().hex[:6]}"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta}
    finally:
        consumer.close()


def _topics(target, prefix: str) -> set[str]:
    return {t for t in clients.admin(target).list_topics(timeout=10).topics if t.startswith(prefix)}


def _group_state(target, group: str) -> ConsumerGroupState:
    admin = clients.admin(target)  # kept while its future runs
    return admin.describe_consumer_groups([group])[group].result(timeout=30).state


def _group_config_set(target, group: str) -> bool:
    """Whether the group's session config is set on the group itself."""
    resource = ConfigResource(ResourceType.GROUP, group)
    admin = clients.admin(target)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    entry = entries.get(CONSUMER_SESSION_TIMEOUT_MS)
    return entry is not None and entry.source == ConfigSource.GROUP_CONFIG.value


def test_a_removed_queue_loses_its_grants_group_and_records_and_keeps_its_topic_with_its_data(
    secure_kafka, tmp_path, cli_env
):
    tag = uuid.uuid4().hex[:8]
    worker, till = secure_kafka.user(f"worker-{tag}"), secure_kafka.user(f"till-{tag}")
    doc = _doc(tag)
    doc["spec"]["access"] = {"worker": f"User:worker-{tag}", "producers": [f"User:till-{tag}"]}
    folder = tmp_path / "specs"
    path = _write(folder, doc)
    cluster = ["--kafka-config", _properties(tmp_path / "admin.properties", secure_kafka.admin)]
    assert _cli(["apply", str(folder), "--yes"], cli_env, cluster).returncode == EXIT_OK
    topic, queue, group = f"{tag}.pay", f"payments/rm-{tag}", f"g-{tag}"
    for _ in range(5):
        assert _produce(till, topic) is None
    _commit(secure_kafka.admin, group, topic, _ends(secure_kafka.admin, topic))  # the worker's progress
    assert _group_state(secure_kafka.admin, group) == ConsumerGroupState.EMPTY
    assert _group_config_set(secure_kafka.admin, group)
    assert len(_acls(secure_kafka.admin, f"User:worker-{tag}")) == 8

    path.unlink()  # the spec leaves git; its folder is empty now
    planned = _cli(["plan", str(folder), "--detailed-exitcode"], cli_env, cluster)
    assert planned.returncode == EXIT_CHANGES, planned.stderr
    lines = _lines(planned.stdout)
    assert f"- acl User:till-{tag} WRITE TOPIC:{topic} revoked: a producer of the removed queue" in lines
    assert f"- acl User:worker-{tag} READ GROUP:{group} revoked: the removed queue's worker" in lines
    assert f"- group {group} deleted with its committed offsets (DeleteGroups)" in lines
    (configs,) = [line for line in lines if line.startswith(f"- group-config {group} ")]
    assert CONSUMER_SESSION_TIMEOUT_MS in configs and CONSUMER_HEARTBEAT_INTERVAL_MS in configs, configs
    assert any(line.startswith(f"= topic {topic} kept with its data (queue; deletionPolicy retain)") for line in lines)
    assert any(line.startswith(f"= topic {topic}.dlq kept with its data") for line in lines)
    assert lines[-1] == f"- records {queue} 4 owner record(s) forgotten"
    assert f"(removed: queue {queue})" in planned.stdout
    assert "release" not in planned.stdout, "spark-submit: no release to uninstall"

    applied = _cli(["apply", str(folder), "--yes"], cli_env, cluster)
    assert applied.returncode == EXIT_OK, applied.stderr
    assert _acls(secure_kafka.admin, f"User:worker-{tag}") == set()
    assert _acls(secure_kafka.admin, f"User:till-{tag}") == set()
    assert _produce(till, topic) == "TOPIC_AUTHORIZATION_FAILED", "the broker refuses the producer now"
    assert _produce(worker, f"{topic}.dlq") == "TOPIC_AUTHORIZATION_FAILED"
    assert _group_state(secure_kafka.admin, group) == ConsumerGroupState.DEAD, "the group and its offsets are gone"
    assert not _group_config_set(secure_kafka.admin, group), "its config outlived nothing"
    assert _records_of(secure_kafka.admin, queue) == set()
    assert _topics(secure_kafka.admin, topic) == {topic, f"{topic}.dlq"}
    assert sum(_ends(secure_kafka.admin, topic).values()) == 5, "the retained topic keeps its records"
    again = _cli(["plan", str(folder), "--detailed-exitcode"], cli_env, cluster)
    assert again.returncode == EXIT_OK and "No changes." in again.stdout, again.stdout


def test_a_delete_topic_goes_only_once_the_worker_stopped_and_the_queue_caught_up(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "specs"
    path = _write(folder, _doc(tag, "delete"))
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    assert _cli(["apply", str(folder), "--yes"], cli_env, cluster).returncode == EXIT_OK
    topic, group = f"{tag}.pay", f"g-{tag}"
    producer = clients.producer(kafka)
    for i in range(4):
        producer.produce(topic, b"v", partition=i % 3)
    producer.flush(10)
    member = clients.consumer(kafka, {"group.id": group, "enable.auto.commit": False, "auto.offset.reset": "latest"})
    member.subscribe([topic])
    try:
        for _ in range(40):  # joined once it has partitions
            member.poll(0.25)
            if member.assignment():
                break
        path.unlink()
        running = _cli(["plan", str(folder), "--removal-grace", "0s", "--detailed-exitcode"], cli_env, cluster)
        assert running.returncode == EXIT_CHANGES, running.stderr
        lines = _lines(running.stdout)
        assert lines[0].startswith(f"> queue payments/rm-{tag} the group has 1 member(s): stop the worker first")
        assert all(line[0] == ">" for line in lines), lines
        held = _cli(["apply", str(folder), "--yes", "--removal-grace", "0s"], cli_env, cluster)
        assert held.returncode == EXIT_OK and "Nothing to apply now" in held.stdout, held.stdout + held.stderr
        assert _topics(kafka, topic) == {topic, f"{topic}.dlq"}
    finally:
        member.close()

    # The worker stopped; four records it never finished: the topics wait until the queue is
    # caught up, the group with them.
    lagging = _cli(["plan", str(folder), "--removal-grace", "0s"], cli_env, cluster)
    lines = _lines(lagging.stdout)
    assert f"> topic {topic} waits until the queue is caught up: lag 4 (records the worker has not finished)" in lines
    assert any(line.startswith(f"> group {group} kept until the queue's topics are caught up") for line in lines)
    assert _cli(["apply", str(folder), "--yes", "--removal-grace", "0s"], cli_env, cluster).returncode == EXIT_OK
    assert _topics(kafka, topic) == {topic, f"{topic}.dlq"}

    # Drained: still within the default grace (a day), then past a grace of none.
    _commit(kafka, group, topic, _ends(kafka, topic))
    graced = _lines(_cli(["plan", str(folder)], cli_env, cluster).stdout)
    assert any(
        line.startswith(f"> topic {topic} waits for the removal grace (1d after its newest record): until")
        for line in graced
    )
    caught_up = _cli(["plan", str(folder), "--removal-grace", "0s", "-o", "json"], cli_env, cluster)
    changes = json.loads(caught_up.stdout)["changes"]
    assert [(c["action"], c["kind"], c["target"]) for c in changes] == [
        ("delete", "group", group),
        ("delete", "group-config", group),
        ("delete", "topic", topic),
        ("delete", "topic", f"{topic}.dlq"),
        ("delete", "records", f"payments/rm-{tag}"),
    ]
    applied = _cli(["apply", str(folder), "--yes", "--removal-grace", "0s"], cli_env, cluster)
    assert applied.returncode == EXIT_OK, applied.stderr
    assert "5 deleted" in applied.stdout
    assert _topics(kafka, topic) == set()
    assert _group_state(kafka, group) == ConsumerGroupState.DEAD
    assert _records_of(kafka, f"payments/rm-{tag}") == set()


def test_a_dead_letter_topic_that_holds_records_goes_only_with_the_force(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "specs"
    path = _write(folder, _doc(tag, "delete"))
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    assert _cli(["apply", str(folder), "--yes"], cli_env, cluster).returncode == EXIT_OK
    topic, dlq = f"{tag}.pay", f"{tag}.pay.dlq"
    producer = clients.producer(kafka)
    for _ in range(2):
        producer.produce(dlq, b"dead")
    producer.flush(10)
    path.unlink()

    unforced = _cli(["plan", str(folder), "--removal-grace", "0s"], cli_env, cluster)
    lines = _lines(unforced.stdout)
    assert f"- topic {topic} deleted (queue; deletionPolicy delete): caught up, empty" in lines
    held = next(line for line in lines if line.startswith(f"> topic {dlq}"))
    assert "holds 2 record(s)" in held and "--force-delete-dlq" in held
    assert _cli(["apply", str(folder), "--yes", "--removal-grace", "0s"], cli_env, cluster).returncode == EXIT_OK
    assert _topics(kafka, topic) == {dlq}, "the queue topic went; the DLQ with records stays"
    assert f"acls:payments/rm-{tag}" in read_records(kafka), "the queue's record stays for what waits"

    forced = _cli(["plan", str(folder), "--removal-grace", "0s", "--force-delete-dlq"], cli_env, cluster)
    assert any(
        line.startswith(f"- topic {dlq} deleted (dead-letter; deletionPolicy delete)") for line in _lines(forced.stdout)
    )
    applied = _cli(["apply", str(folder), "--yes", "--removal-grace", "0s", "--force-delete-dlq"], cli_env, cluster)
    assert applied.returncode == EXIT_OK, applied.stderr
    assert _topics(kafka, topic) == set()
    assert _records_of(kafka, f"payments/rm-{tag}") == set()


def test_a_renamed_queue_keeps_its_topics_and_group_and_the_old_name_is_removed(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "specs"
    old = _write(folder, _doc(tag))
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    assert _cli(["apply", str(folder), "--yes"], cli_env, cluster).returncode == EXIT_OK
    producer = clients.producer(kafka)
    producer.produce(f"{tag}.pay", b"kept")
    producer.flush(10)
    old.unlink()
    _write(folder, _doc(tag, name=f"ledger-{tag}"), "ledger.yaml")

    planned = _cli(["plan", str(folder)], cli_env, cluster)
    assert planned.returncode == EXIT_OK, planned.stderr
    lines = _lines(planned.stdout)
    rename = f"owner: queue payments/rm-{tag} -> payments/ledger-{tag} (renamed)"
    assert f"~ topic {tag}.pay {rename}" in lines and f"~ group g-{tag} {rename}" in lines
    assert any(line.startswith(f"~ queue payments/ledger-{tag} renamed from queue payments/rm-{tag}") for line in lines)
    assert f"(removed: queue payments/rm-{tag}, renamed to payments/ledger-{tag})" in planned.stdout
    assert [line for line in lines if line.startswith(("-", "="))] == [
        f"- records payments/rm-{tag} 1 owner record(s) forgotten"
    ], "nothing it handed over goes"

    assert _cli(["apply", str(folder), "--yes"], cli_env, cluster).returncode == EXIT_OK
    records = read_records(kafka)
    assert records[f"{tag}.pay"]["queue"] == records[f"group:g-{tag}"]["queue"] == f"payments/ledger-{tag}"
    assert _records_of(kafka, f"payments/rm-{tag}") == set()
    assert records[f"acls:payments/ledger-{tag}"]["specKey"] is None and records[f"acls:payments/ledger-{tag}"][
        "spec"
    ] == str(folder / "ledger.yaml")
    assert sum(_ends(kafka, f"{tag}.pay").values()) == 1
    assert "No changes." in _cli(["plan", str(folder)], cli_env, cluster).stdout


def test_a_saved_plan_with_a_removal_is_refused_once_the_removed_queue_moved(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "specs"
    path = _write(folder, _doc(tag, "delete"))
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    assert _cli(["apply", str(folder), "--yes"], cli_env, cluster).returncode == EXIT_OK
    path.unlink()
    plan_file = tmp_path / "removal.json"
    made = _cli(["plan", str(folder), "--removal-grace", "0s", "--out", str(plan_file)], cli_env, cluster)
    assert made.returncode == EXIT_OK, made.stderr
    saved = json.loads(plan_file.read_text())
    assert saved["paths"] == [str(folder.resolve())] and saved["removal"] == {
        "graceSeconds": 0,
        "forceDeleteDlq": False,
    }
    assert {c["removes"] for c in saved["plan"]["changes"]} == {f"payments/rm-{tag}"}
    assert ("delete", "topic", f"{tag}.pay") in {
        (c["action"], c["kind"], c["target"]) for c in saved["plan"]["changes"]
    }

    # A producer writes to the empty queue topic meanwhile: it is no longer caught up.
    producer = clients.producer(kafka)
    producer.produce(f"{tag}.pay", b"late")
    producer.flush(10)
    refused = run_cli(["apply", str(plan_file), *cluster], cli_env)
    assert refused.returncode == EXIT_STALE, refused.stderr
    assert "the cluster changed since the plan was made" in refused.stderr and "Traceback" not in refused.stderr
    assert _topics(kafka, f"{tag}.pay") == {f"{tag}.pay", f"{tag}.pay.dlq"}
    assert f"acls:payments/rm-{tag}" in read_records(kafka), "nothing was removed"

    # Planned again (it now waits until the queue is caught up), that plan applies exactly: the
    # owner records stay for it.
    made = _cli(["plan", str(folder), "--removal-grace", "0s", "--out", str(plan_file)], cli_env, cluster)
    waits = f"> topic {tag}.pay waits until the queue is caught up: lag 1 (records the worker has not finished)"
    assert waits in _lines(made.stdout)
    applied = run_cli(["apply", str(plan_file), *cluster], cli_env)
    assert applied.returncode == EXIT_OK, applied.stderr


def test_a_release_apply_cannot_reach_is_not_uninstalled_and_nothing_is_removed(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "specs"
    path = _write(folder, _doc(tag, target="kubernetes"))
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    assert _cli(["apply", str(folder), "--yes"], cli_env, cluster).returncode == EXIT_OK
    path.unlink()
    planned = _cli(["plan", str(folder)], cli_env, cluster)
    assert f"- release payments/rm-{tag} helm uninstall --wait" in " ".join(planned.stdout.split())
    refused = _cli(["apply", str(folder), "--yes", "--kubeconfig", str(tmp_path / "none")], cli_env, cluster)
    assert refused.returncode == EXIT_FAILED
    assert "dry run; nothing was applied" in refused.stderr and "no kubeconfig at" in refused.stderr, refused.stderr
    assert len(_records_of(kafka, f"payments/rm-{tag}")) == 4, "every owner record is still there"


def test_a_removal_that_fails_midway_says_what_it_removed_and_the_next_plan_finishes_it(kafka, tmp_path):
    """A worker rejoins the group between the dry run and the real step: DeleteGroups is refused
    (the group is not empty), the report says what was removed and what was not attempted, and
    the owner records, forgotten last, still lead the next plan to the rest."""
    from queueplane.provision import steps
    from queueplane.provision.apply import ApplyFailed

    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "specs"
    path = _write(folder, _doc(tag))
    steps.apply(steps.plan([str(folder)], kafka))
    topic, group, queue = f"{tag}.pay", f"g-{tag}", f"payments/rm-{tag}"
    _commit(kafka, group, topic, {0: 0})
    path.unlink()
    planned = steps.plan([str(folder)], kafka)
    member = clients.consumer(kafka, {"group.id": group, "enable.auto.commit": False})

    def rejoin(title: str, _count: int) -> None:
        if title == "checked: forget owner records":  # every dry run passed
            member.subscribe([topic])
            for _ in range(40):
                member.poll(0.25)
                if member.assignment():
                    return

    try:
        with pytest.raises(ApplyFailed) as caught:
            steps.apply(planned, rejoin)
        report = caught.value.report.as_dict()
        assert [f["change"] for f in report["failed"]] == [
            f"- group {group} deleted with its committed offsets (DeleteGroups)"
        ]
        assert "NON_EMPTY_GROUP" in report["failed"][0]["error"]
        assert report["applied"] == []
        assert report["not_attempted"] == [
            f"- group-config {group} {CONSUMER_HEARTBEAT_INTERVAL_MS}, {CONSUMER_SESSION_TIMEOUT_MS} deleted"
            " (GROUP configs outlive the group)",
            f"- records {queue} 4 owner record(s) forgotten",
        ]
        message = str(caught.value)
        assert "\n" not in message and "applied 0: nothing" in message and "Not attempted 2" in message
        assert len(_records_of(kafka, queue)) == 4, "nothing forgotten: the next plan finds the removal"
    finally:
        member.close()

    rest = steps.plan([str(folder)], kafka)
    assert {(c.symbol, c.kind) for c in rest.plan.actionable} == {
        ("-", "group"),
        ("-", "group-config"),
        ("-", "records"),
    }
    steps.apply(rest)
    assert _group_state(kafka, group) == ConsumerGroupState.DEAD and _records_of(kafka, queue) == set()
