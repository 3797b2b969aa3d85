"""Guardrails between teams against the real broker: what a spec may not do changes nothing.

Refused specs exit 2 naming the field (nothing applied); a topic that exists but that no spec
created is taken over only with adopt: true; a topic another queue owns never is.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from helpers import run_cli
from specs_factory import dump, set_path, spec

from queueplane.errors import EXIT_INVALID, EXIT_OK, EXIT_REFUSED
from queueplane.kafka.owners import OWNERS_TOPIC

pytestmark = pytest.mark.kafka


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _exists(kafka, names: list[str]) -> dict[str, bool]:
    admin = AdminClient(dict(kafka.settings))
    out = {}
    for name, future in admin.describe_topics(TopicCollection(names)).items():
        try:
            future.result()
            out[name] = True
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
            out[name] = False
    return out


def _topic_config(kafka, topic: str, key: str) -> str:
    admin = AdminClient(dict(kafka.settings))
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result()[key].value


def _cli(args: list[str], kafka, cli_env):
    return run_cli([*args, "--bootstrap-servers", kafka.bootstrap], cli_env)


def test_a_spec_beyond_its_teams_allowance_is_refused_by_apply_and_deploy_and_changes_nothing(kafka, tmp_path, cli_env):
    tag = _tag()
    root = tmp_path / "specs"
    (root / "attacker").mkdir(parents=True)
    platform = {
        "apiVersion": "queueplane.io/v1",
        "kind": "Platform",
        "teams": {"attacker": {}, "victim-team": {"topicPrefixes": [f"victim-{tag}."]}},
    }
    (root / "platform.yaml").write_text(yaml.safe_dump(platform))
    doc = spec("share", name="coredns", group=f"g-{tag}", topic=f"victim-{tag}.orders")
    set_path(doc, "metadata/team", "victim-team")
    set_path(doc, "spec/deployment/namespace", "kube-system")
    set_path(doc, "spec/deployment/image", "evil.example.com/miner:1")
    path = root / "attacker" / "coredns.yaml"
    path.write_text(dump(doc))

    applied = _cli(["apply", str(path), "--yes"], kafka, cli_env)
    assert applied.returncode == EXIT_INVALID, applied.stdout + applied.stderr
    assert "/metadata/team" in applied.stderr and "/spec/deployment/namespace" in applied.stderr
    assert "/spec/deployment/image" in applied.stderr and "nothing was changed" in applied.stderr
    assert _exists(kafka, [f"victim-{tag}.orders", f"victim-{tag}.orders.dlq"]) == {
        f"victim-{tag}.orders": False,
        f"victim-{tag}.orders.dlq": False,
    }
    kubeconfig = tmp_path / "kubeconfig"  # never read: the spec is refused first
    deployed = run_cli(["deploy", str(path), "--kubeconfig", str(kubeconfig)], cli_env)
    assert deployed.returncode == EXIT_INVALID, deployed.stderr
    assert "/spec/deployment/namespace" in deployed.stderr and "Traceback" not in deployed.stderr


def test_a_spec_naming_kafkas_offsets_topic_is_refused_and_the_topic_keeps_its_configs(kafka, tmp_path, cli_env):
    doc = spec("share", name=f"o-{_tag()}", group=f"g-{_tag()}")
    set_path(doc, "spec/topic/name", "__consumer_offsets")
    set_path(doc, "spec/topic/config", {"cleanup.policy": "delete", "retention.ms": 1})
    set_path(doc, "spec/deadLetter/topic", f"{_tag()}.dlq")
    path = tmp_path / "offsets.yaml"
    path.write_text(dump(doc))
    # A committed offset makes the broker create __consumer_offsets, if no test has yet.
    scratch = f"{_tag()}.scratch"
    _existing_topic(kafka, scratch, "3600000")
    committer = Consumer({**kafka.settings, "group.id": f"c-{_tag()}"})
    committer.commit(offsets=[TopicPartition(scratch, 0, 0)], asynchronous=False)
    committer.close()
    before = _topic_config(kafka, "__consumer_offsets", "cleanup.policy")

    for command in (["plan", str(path)], ["apply", str(path), "--yes"]):
        result = _cli(command, kafka, cli_env)
        assert result.returncode == EXIT_INVALID, result.stdout + result.stderr
        assert '/spec/topic/name: "__consumer_offsets" is an internal topic' in result.stderr

    assert before == "compact"
    assert _topic_config(kafka, "__consumer_offsets", "cleanup.policy") == "compact"


def _existing_topic(kafka, name: str, retention_ms: str) -> None:
    admin = AdminClient(dict(kafka.settings))
    admin.create_topics([NewTopic(name, 2, 1, config={"retention.ms": retention_ms})])[name].result()


def test_an_existing_topic_is_adopted_only_when_the_spec_says_so_and_another_queue_can_never_take_it(
    kafka, tmp_path, cli_env
):
    tag = _tag()
    topic = f"{tag}.legacy"
    _existing_topic(kafka, topic, "3600000")
    doc = spec("share", name=f"a-{tag}", group=f"ga-{tag}", topic=topic)
    doc["spec"]["topic"]["partitions"] = 2
    path = tmp_path / "adopter.yaml"
    path.write_text(dump(doc))

    refused = _cli(["apply", str(path), "--yes"], kafka, cli_env)
    assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
    assert "nothing was applied" in refused.stderr
    assert "no queueplane spec created it" in refused.stderr and "spec.topic.adopt: true" in refused.stderr
    assert _exists(kafka, [f"{topic}.dlq"]) == {f"{topic}.dlq": False}, "a refused plan applies nothing"
    assert _topic_config(kafka, topic, "retention.ms") == "3600000"

    doc["spec"]["topic"]["adopt"] = True
    path.write_text(dump(doc))
    planned = _cli(["plan", str(path)], kafka, cli_env)
    assert planned.returncode == EXIT_OK, planned.stderr
    (line,) = [ln.split() for ln in planned.stdout.splitlines() if ln.strip().startswith("=")]
    assert line == ["=", "topic", topic, "adopted", "as", "it", "is", "(queue)"], planned.stdout
    assert "1 to adopt" in planned.stdout
    adopted = _cli(["apply", str(path), "--yes"], kafka, cli_env)
    assert adopted.returncode == EXIT_OK, adopted.stderr
    assert "1 adopted" in adopted.stdout
    assert _topic_config(kafka, topic, "retention.ms") == "604800000", "the spec manages its configs from now on"
    again = _cli(["plan", str(path)], kafka, cli_env)
    assert "No changes." in again.stdout, again.stdout

    # Another team's spec, run on its own (not beside the owner), naming the same topic.
    other = spec("share", name=f"b-{tag}", group=f"gb-{tag}", topic=topic)
    other["metadata"]["team"] = "bakery"
    other["spec"]["topic"]["adopt"] = True
    other["spec"]["topic"]["partitions"] = 2
    other["spec"]["deadLetter"] = {"topic": f"{tag}.bakery.dlq"}
    other_path = tmp_path / "other" / "thief.yaml"
    other_path.parent.mkdir()
    other_path.write_text(dump(other))
    stolen = _cli(["apply", str(other_path), "--yes", "-o", "json"], kafka, cli_env)
    assert stolen.returncode == EXIT_REFUSED, stolen.stdout + stolen.stderr
    assert f"belongs to queue kitchen/a-{tag} ({path})" in stolen.stderr
    assert _exists(kafka, [f"{tag}.bakery.dlq"]) == {f"{tag}.bakery.dlq": False}


def test_every_topic_apply_creates_is_recorded_as_its_queues(kafka, tmp_path, cli_env):
    tag = _tag()
    doc = spec("kmq", name=f"c-{tag}", group=f"gc-{tag}", topic=f"{tag}.jobs")
    path = tmp_path / "jobs.yaml"
    path.write_text(dump(doc))
    assert _cli(["apply", str(path), "--yes"], kafka, cli_env).returncode == EXIT_OK

    consumer = Consumer({**kafka.settings, "group.id": f"read-{tag}", "enable.partition.eof": True})
    consumer.assign([TopicPartition(OWNERS_TOPIC, 0, 0)])
    records = {}
    while True:
        message = consumer.poll(10)
        assert message is not None
        if message.error():
            break
        if message.value() is None:  # a removed queue's tombstone
            records.pop(message.key().decode(), None)
            continue
        records[message.key().decode()] = json.loads(message.value())
    consumer.close()
    roles = {f"{tag}.jobs": "queue", f"{tag}.jobs.dlq": "dead-letter", f"{tag}.jobs.markers": "markers"}
    for name, role in roles.items():
        assert records[name] == {"queue": f"mail/c-{tag}", "spec": str(path), "role": role}
