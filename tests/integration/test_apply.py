"""plan/apply against the real local Kafka broker, checked with Kafka's own describe APIs."""

from __future__ import annotations

import json
import os
import pty
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from helpers import REPO, run_cli
from specs_factory import dump, spec

from queueplane.errors import (
    EXIT_CHANGES,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_REFUSED,
    ClusterUnreachable,
    PlanRefused,
)
from queueplane.kafka import names as kn
from queueplane.kafka.cluster import CONNECT_TIMEOUT_S, Cluster
from queueplane.kafka.target import KafkaTarget
from queueplane.provision import steps
from queueplane.provision.apply import ApplyFailed
from queueplane.run.driver.options import STARTUP_WAIT_S

pytestmark = pytest.mark.kafka


def _unique() -> str:
    return uuid.uuid4().hex[:8]


def _write(directory: Path, doc: dict, name: str | None = None) -> Path:
    path = directory / f"{name or doc['metadata']['name']}.yaml"
    path.write_text(dump(doc))
    return path


def _admin(kafka: KafkaTarget) -> AdminClient:
    return AdminClient(dict(kafka.settings))


def _describe_topics(kafka: KafkaTarget, names: list[str]) -> dict[str, tuple[int, int] | None]:
    admin = _admin(kafka)  # keep a reference: futures fail if their client is collected
    out: dict[str, tuple[int, int] | None] = {}
    for name, future in admin.describe_topics(TopicCollection(names)).items():
        try:
            desc = future.result()
            out[name] = (len(desc.partitions), len(desc.partitions[0].replicas))
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
            out[name] = None
    return out


def _configs(kafka: KafkaTarget, kind: ResourceType, name: str) -> dict[str, str]:
    resource = ConfigResource(kind, name)
    admin = _admin(kafka)
    entries = admin.describe_configs([resource])[resource].result()
    return {k: v.value for k, v in entries.items()}


def _topics_with_prefix(kafka: KafkaTarget, prefix: str) -> set[str]:
    return {t for t in _admin(kafka).list_topics(timeout=10).topics if t.startswith(prefix)}


def _specs(tmp_path: Path, tag: str) -> tuple[dict, dict, dict]:
    share = spec("share", name=f"s-{tag}", group=f"gs-{tag}", topic=f"{tag}.orders")
    share["spec"]["topic"]["config"] = {"retention.ms": 3_600_000, "max.message.bytes": "2097152"}
    share["spec"]["group"].update(lockDuration="5s", deliveryLimit=3, maxInFlight=500)
    share["spec"]["deadLetter"] = {"partitions": 2, "config": {"retention.ms": "86400000"}}
    consumer = spec("consumer", name=f"c-{tag}", group=f"gc-{tag}", topic=f"{tag}.payments")
    kmq = spec("kmq", name=f"k-{tag}", group=f"gk-{tag}", topic=f"{tag}.mail")
    for doc in (share, consumer, kmq):
        _write(tmp_path, doc)
    return share, consumer, kmq


def test_apply_creates_exactly_what_the_specs_declare_and_reapply_changes_nothing(kafka, tmp_path):
    tag = _unique()
    _specs(tmp_path, tag)
    planned = steps.plan([str(tmp_path)], kafka)
    assert planned.plan.refused == []
    steps.apply(planned)

    topics = _describe_topics(
        kafka,
        [
            f"{tag}.orders",
            f"{tag}.orders.dlq",
            f"{tag}.orders.out",
            f"{tag}.payments",
            f"{tag}.payments.dlq",
            f"{tag}.mail",
            f"{tag}.mail.dlq",
            f"{tag}.mail.markers",
        ],
    )
    assert topics == {
        f"{tag}.orders": (6, 1),
        f"{tag}.orders.dlq": (2, 1),
        f"{tag}.orders.out": (6, 1),
        f"{tag}.payments": (3, 1),
        f"{tag}.payments.dlq": (3, 1),
        f"{tag}.mail": (2, 1),
        f"{tag}.mail.dlq": (2, 1),
        f"{tag}.mail.markers": (2, 1),
    }
    assert _topics_with_prefix(kafka, tag) == set(topics), "apply created topics no spec declared"

    orders = _configs(kafka, ResourceType.TOPIC, f"{tag}.orders")
    assert orders["retention.ms"] == "3600000" and orders["max.message.bytes"] == "2097152"
    assert _configs(kafka, ResourceType.TOPIC, f"{tag}.orders.dlq")["retention.ms"] == "86400000"
    markers = _configs(kafka, ResourceType.TOPIC, f"{tag}.mail.markers")
    assert markers["retention.ms"] == "3600000" and markers["cleanup.policy"] == "delete"

    group = _configs(kafka, ResourceType.GROUP, f"gs-{tag}")
    assert group[kn.SHARE_LOCK_DURATION_MS] == "5000"
    assert group[kn.SHARE_DELIVERY_COUNT_LIMIT] == "5"  # deliveryLimit 3 plus the reserve deliveries
    assert group[kn.SHARE_MAX_RECORD_LOCKS] == "500"
    assert group[kn.SHARE_AUTO_OFFSET_RESET] == "earliest"
    assert group[kn.SHARE_ISOLATION_LEVEL] == "read_committed"
    # The consumer protocol's session and heartbeat are the group's: the members' 10 s and 1 s,
    # which the local broker allows.
    consumer_group = _configs(kafka, ResourceType.GROUP, f"gc-{tag}")
    assert consumer_group[kn.CONSUMER_SESSION_TIMEOUT_MS] == "10000"
    assert consumer_group[kn.CONSUMER_HEARTBEAT_INTERVAL_MS] == "1000"

    again = steps.plan([str(tmp_path)], kafka)
    assert again.plan.changes == []


def test_partitions_can_grow_but_never_shrink_and_replication_is_fixed(kafka, tmp_path, cli_env):
    tag = _unique()
    doc = spec("consumer", name=f"p-{tag}", group=f"gp-{tag}", topic=f"{tag}.grow")
    path = _write(tmp_path, doc)
    steps.apply(steps.plan([str(path)], kafka))

    doc["spec"]["topic"]["partitions"] = 5
    _write(tmp_path, doc)
    planned = steps.plan([str(path)], kafka)
    # The dead-letter topic follows the queue topic's partition count unless the spec sets its own.
    assert [(c.action, c.kind, c.target, c.old, c.new) for c in planned.plan.changes] == [
        ("change", "partitions", f"{tag}.grow", "3", "5"),
        ("change", "partitions", f"{tag}.grow.dlq", "3", "5"),
    ]
    steps.apply(planned)
    assert _describe_topics(kafka, [f"{tag}.grow"])[f"{tag}.grow"] == (5, 1)

    doc["spec"]["topic"]["partitions"] = 2
    doc["spec"]["topic"]["config"] = {"retention.ms": "120000"}
    _write(tmp_path, doc)
    result = run_cli(["apply", str(path), "--yes", "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert "! partitions" in result.stdout and "Kafka cannot remove partitions" in result.stdout
    assert "nothing was applied" in result.stderr
    # Refusal is all-or-nothing: the config change in the same plan was not applied either.
    assert _describe_topics(kafka, [f"{tag}.grow"])[f"{tag}.grow"] == (5, 1)
    assert _configs(kafka, ResourceType.TOPIC, f"{tag}.grow")["retention.ms"] != "120000"

    doc["spec"]["topic"]["partitions"] = 5
    doc["spec"]["topic"]["replicationFactor"] = 2
    _write(tmp_path, doc)
    with pytest.raises(PlanRefused):
        steps.apply(steps.plan([str(path)], kafka))


def test_kmq_markers_topic_follows_the_queue_partitions_and_keeps_markers_twice_the_lock(kafka, tmp_path):
    tag = _unique()
    doc = spec("kmq", name=f"m-{tag}", group=f"gm-{tag}", topic=f"{tag}.jobs")
    doc["spec"]["group"]["lockDuration"] = "90s"
    doc["spec"]["markers"] = {"topic": f"{tag}.jobs.progress", "retention": "3m"}
    path = _write(tmp_path, doc)
    steps.apply(steps.plan([str(path)], kafka))
    assert _describe_topics(kafka, [f"{tag}.jobs.progress"])[f"{tag}.jobs.progress"] == (2, 1)
    markers = _configs(kafka, ResourceType.TOPIC, f"{tag}.jobs.progress")
    assert markers["retention.ms"] == "180000" and markers["cleanup.policy"] == "delete"

    doc["spec"]["topic"]["partitions"] = 4
    doc["spec"]["markers"]["retention"] = "1h"
    _write(tmp_path, doc)
    planned = steps.plan([str(path)], kafka)
    assert {(c.kind, c.target, c.field, c.new) for c in planned.plan.changes} == {
        ("partitions", f"{tag}.jobs", "partitions", "4"),
        ("partitions", f"{tag}.jobs.dlq", "partitions", "4"),
        ("partitions", f"{tag}.jobs.progress", "partitions", "4"),
        ("topic-config", f"{tag}.jobs.progress", "retention.ms", "3600000"),
    }
    steps.apply(planned)
    assert _describe_topics(kafka, [f"{tag}.jobs.progress"])[f"{tag}.jobs.progress"] == (4, 1)
    assert _configs(kafka, ResourceType.TOPIC, f"{tag}.jobs.progress")["retention.ms"] == "3600000"
    assert steps.plan([str(path)], kafka).plan.changes == []


def test_a_change_the_broker_rejects_applies_nothing(kafka, tmp_path):
    tag = _unique()
    good = spec("consumer", name=f"g-{tag}", group=f"gg-{tag}", topic=f"{tag}.good")
    bad = spec("consumer", name=f"b-{tag}", group=f"gb-{tag}", topic=f"{tag}.bad")
    bad["spec"]["topic"]["config"] = {"cleanup.policy": "sometimes"}
    _write(tmp_path, good)
    _write(tmp_path, bad)
    planned = steps.plan([str(tmp_path)], kafka)
    with pytest.raises(Exception, match="nothing was applied") as caught:
        steps.apply(planned)
    assert f"{tag}.bad" in str(caught.value)
    assert _topics_with_prefix(kafka, tag) == set()


def test_an_apply_that_fails_midway_says_exactly_what_it_applied_and_a_rerun_finishes(kafka, tmp_path):
    """Another applier creates a topic between the dry run and the real step, as a second team's
    pipeline can: the step fails for that topic only, later steps are not attempted, and the
    report matches what the cluster then holds."""
    tag = _unique()
    grown = spec("consumer", name=f"a-{tag}", group=f"ga-{tag}", topic=f"{tag}.grown")
    steps.apply(steps.plan([str(_write(tmp_path, grown))], kafka))
    grown["spec"]["topic"]["partitions"] = 5
    grown["spec"]["topic"]["config"] = {"retention.ms": "7200000"}
    _write(tmp_path, grown)
    _write(tmp_path, spec("consumer", name=f"n-{tag}", group=f"gn-{tag}", topic=f"{tag}.new"))
    planned = steps.plan([str(tmp_path)], kafka)

    def race(title: str, _count: int) -> None:
        if title == "set topic configs":  # the real step, after every dry run passed
            admin = _admin(kafka)  # kept while its future runs
            admin.create_topics([NewTopic(f"{tag}.new.dlq", num_partitions=1)])[f"{tag}.new.dlq"].result()

    with pytest.raises(ApplyFailed) as caught:
        steps.apply(planned, race)
    report = caught.value.report.as_dict()
    created = "partitions=3 replicationFactor=1 (cluster default)"
    dlq_size = f"max.message.bytes={1_048_588 + 64 * 1024}"  # the broker's default, and room for the headers
    assert report["failed"] == [
        {
            "change": f"+ topic {tag}.new.dlq {created} {dlq_size} (dead-letter)",
            "error": f"TOPIC_ALREADY_EXISTS: Topic '{tag}.new.dlq' already exists.",
        }
    ]
    assert report["applied"] == [
        f"+ group gn-{tag} claimed for queue payments/n-{tag}",
        f"~ group-config gn-{tag} {kn.CONSUMER_HEARTBEAT_INTERVAL_MS}: 5000 -> 1000",
        f"~ group-config gn-{tag} {kn.CONSUMER_SESSION_TIMEOUT_MS}: 45000 -> 10000",
        f"~ topic-config {tag}.grown retention.ms: 604800000 -> 7200000",
        f"+ topic {tag}.new {created}",
    ]
    assert report["not_attempted"] == [
        f"~ partitions {tag}.grown partitions: 3 -> 5",
        f"~ partitions {tag}.grown.dlq partitions: 3 -> 5",
    ]
    message = str(caught.value)
    assert "\n" not in message and f"{tag}.new.dlq" in message
    assert "already exists; applied 5: group" in message and "Not attempted 2: partitions" in message
    # The cluster holds what the report says, no more and no less.
    assert _configs(kafka, ResourceType.TOPIC, f"{tag}.grown")["retention.ms"] == "7200000"
    assert _describe_topics(kafka, [f"{tag}.grown", f"{tag}.new", f"{tag}.new.dlq"]) == {
        f"{tag}.grown": (3, 1),
        f"{tag}.new": (3, 1),
        f"{tag}.new.dlq": (1, 1),  # the other applier's
    }
    # A new plan shows what is left, and applying it finishes the job.
    rest = steps.plan([str(tmp_path)], kafka)
    assert {(c.kind, c.target, c.new) for c in rest.plan.changes} == {
        ("partitions", f"{tag}.grown", "5"),
        ("partitions", f"{tag}.grown.dlq", "5"),
        ("partitions", f"{tag}.new.dlq", "3"),
        ("topic-config", f"{tag}.new.dlq", str(1_048_588 + 64 * 1024)),  # made by the other applier's defaults
    }
    steps.apply(rest)
    assert steps.plan([str(tmp_path)], kafka).plan.changes == []


def test_plan_json_and_live_broker_bounds(kafka, tmp_path, cli_env):
    tag = _unique()
    doc = spec("share", name=f"j-{tag}", group=f"gj-{tag}", topic=f"{tag}.json")
    doc["spec"]["group"]["lockDuration"] = "2s"  # below Kafka's default bound, within the local broker's
    path = _write(tmp_path, doc)
    offline = run_cli(["validate", str(path)], cli_env)
    assert offline.returncode == EXIT_INVALID
    assert "/spec/group/lockDuration: 2s is outside the share-group range 15s..1m" in offline.stderr
    result = run_cli(["plan", str(path), "-o", "json", "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    # Three topics and the group's claim.
    assert plan["summary"] == {"create": 4, "adopt": 0, "change": 5, "delete": 0, "refuse": 0, "retain": 0, "wait": 0}
    assert {c["target"] for c in plan["changes"] if c["kind"] == "topic"} == {
        f"{tag}.json",
        f"{tag}.json.dlq",
        f"{tag}.json.out",
    }
    assert _topics_with_prefix(kafka, tag) == set(), "plan must not change the cluster"


def test_cli_uses_the_running_local_stack_by_default(local_kafka, tmp_path, cli_env):
    tag = _unique()
    path = _write(tmp_path, spec("kmq", name=f"l-{tag}", group=f"gl-{tag}", topic=f"{tag}.local"))
    first = run_cli(["apply", str(path), "--yes"], cli_env)
    assert first.returncode == 0, first.stderr
    assert f"{local_kafka.bootstrap} (local stack)" in first.stdout
    # Three topics and the group's claim; the group's session and heartbeat (kmq's workers are its members).
    assert "Apply complete: 4 created, 2 changed." in first.stdout
    second = run_cli(["apply", str(path), "--yes"], cli_env)
    assert "No changes. The cluster matches 1 spec(s)." in second.stdout


def test_unreachable_broker_fails_fast_and_clearly(tmp_path, cli_env):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        path = _write(tmp_path, spec("share"))
        result = run_cli(["apply", str(path), "--yes", "--bootstrap-servers", f"127.0.0.1:{port}"], cli_env)
        # The README's promise, from the first try to connect: failed within 10 seconds. Timed in
        # this process, from the connection on: the command's own start is the interpreter's.
        started = time.monotonic()
        with pytest.raises(ClusterUnreachable, match=f"within {CONNECT_TIMEOUT_S:.0f}s"):
            Cluster(KafkaTarget({"bootstrap.servers": f"127.0.0.1:{port}"}, "unreachable"))
        elapsed = time.monotonic() - started
    assert result.returncode == EXIT_FAILED
    assert f"cannot reach Kafka at 127.0.0.1:{port} within {CONNECT_TIMEOUT_S:.0f}s" in result.stderr
    assert "nothing was changed" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # It gives up at its own bound, not at the client's request timeout (60 s).
    assert CONNECT_TIMEOUT_S <= elapsed < 10, elapsed


def test_a_worker_started_before_its_broker_tries_for_two_minutes_then_fails_in_one_line(tmp_path, cli_env):
    """The README's other promise: `run` waits for an unreachable cluster up to STARTUP_WAIT_S
    (two minutes), a warning at each try, then ends with one error line and starts nothing."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        path = _write(tmp_path, spec("share"))
        started = time.monotonic()
        result = run_cli(["run", str(path), "--bootstrap-servers", f"127.0.0.1:{port}"], cli_env, timeout=300)
        took = time.monotonic() - started
    assert result.returncode == EXIT_FAILED, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert f"no answer in {STARTUP_WAIT_S:.0f}s of trying" in lines[-1] and "nothing was changed" in lines[-1], lines
    assert [line for line in lines if "Traceback" in line or "ERROR" in line] == [], lines
    tries = [line for line in lines[:-1] if "trying again for" in line]
    assert len(tries) >= STARTUP_WAIT_S / (CONNECT_TIMEOUT_S + 2) - 1, lines
    assert result.stdout == "", "no summary: nothing ran"
    # From the command's start: its interpreter's start (a few seconds) and the last try's timeout on top.
    assert STARTUP_WAIT_S <= took < STARTUP_WAIT_S + CONNECT_TIMEOUT_S + 20, took


def test_no_cluster_named_and_no_local_stack_is_a_usage_error(tmp_path, cli_env):
    env = dict(cli_env, QUEUEPLANE_HOME=str(tmp_path / "empty-home"))
    result = run_cli(["plan", "specs/examples"], env)
    assert result.returncode == EXIT_INVALID
    assert "local stack is not running" in result.stderr and "--bootstrap-servers" in result.stderr


def test_kafka_config_file_settings_are_used(kafka, tmp_path, cli_env):
    config = tmp_path / "client.properties"
    config.write_text("# test\nbootstrap.servers=${TEST_BOOTSTRAP}\nclient.id=queueplane-test\n")
    result = run_cli(
        ["plan", "specs/examples", "--kafka-config", str(config)], dict(cli_env, TEST_BOOTSTRAP=kafka.bootstrap)
    )
    assert result.returncode == 0, result.stderr
    assert f"Cluster: {kafka.bootstrap}" in result.stdout
    missing = run_cli(["plan", "specs/examples", "--kafka-config", str(config)], cli_env)
    assert missing.returncode == EXIT_INVALID and "${TEST_BOOTSTRAP} is not set" in missing.stderr


def _run_in_terminal(args: list[str], env: dict[str, str], answer: str) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal and type ``answer`` at its prompt, as a person would."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "queueplane", *args],
        stdin=child,
        stdout=child,
        stderr=child,
        env=dict(env, COLUMNS="200"),
        cwd=REPO,
        close_fds=True,
    )
    os.close(child)
    seen = b""
    deadline = time.monotonic() + 60
    answered = False
    while time.monotonic() < deadline:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if not answered and b"Only 'yes' applies" in seen:
            os.write(main, answer.encode() + b"\n")
            answered = True
    os.close(main)
    return proc.wait(timeout=60), seen.decode(errors="replace")


def test_apply_asks_first_and_only_yes_applies(kafka, tmp_path, cli_env):
    tag = _unique()
    path = _write(tmp_path, spec("consumer", name=f"i-{tag}", group=f"gi-{tag}", topic=f"{tag}.ask"))
    args = ["apply", str(path), "--bootstrap-servers", kafka.bootstrap]
    code, screen = _run_in_terminal(args, cli_env, "y")
    assert code == 0 and "Apply cancelled; nothing was changed." in screen
    assert _topics_with_prefix(kafka, tag) == set()
    code, screen = _run_in_terminal(args, cli_env, "yes")
    # Two topics and the group's claim; the group's session and heartbeat.
    assert code == 0 and "Apply complete: 3 created, 2 changed." in screen
    assert _topics_with_prefix(kafka, tag) == {f"{tag}.ask", f"{tag}.ask.dlq"}


def _colours(screen: str) -> set[str]:
    """The foreground colours in a terminal's output (SGR 30-37, 38;..., 90-97), not bold or cursor moves."""
    found = set()
    for params in re.findall(r"\x1b\[([0-9;]*)m", screen):
        codes = params.split(";")
        found |= {c for c in codes[:1] + codes[1:] if c and (30 <= int(c) <= 38 or 90 <= int(c) <= 97)}
    return found


def test_plan_detailed_exitcode_gates_on_drift_and_colour_is_off_when_asked(kafka, tmp_path, cli_env):
    tag = _unique()
    path = _write(tmp_path, spec("consumer", name=f"d-{tag}", group=f"gd-{tag}", topic=f"{tag}.drift"))
    args = ["plan", str(path), "--bootstrap-servers", kafka.bootstrap]
    assert run_cli(args, cli_env).returncode == EXIT_OK, "without the flag, changes are not an error"
    drift = run_cli([*args, "--detailed-exitcode"], cli_env)
    assert drift.returncode == EXIT_CHANGES, drift.stderr
    assert "Plan: 3 to create, 2 to change, 0 refused." in drift.stdout
    steps.apply(steps.plan([str(path)], kafka))
    assert run_cli([*args, "--detailed-exitcode"], cli_env).returncode == EXIT_OK
    doc = spec("consumer", name=f"d-{tag}", group=f"gd-{tag}", topic=f"{tag}.drift")
    doc["spec"]["topic"]["partitions"] = 1
    _write(tmp_path, doc)
    refused = run_cli([*args, "--detailed-exitcode"], cli_env)
    assert refused.returncode == EXIT_REFUSED, "a refused change outranks drift"

    doc["spec"]["topic"]["partitions"] = 4
    _write(tmp_path, doc)
    env = {k: v for k, v in cli_env.items() if k != "NO_COLOR"}
    _, coloured = _run_in_terminal(args, env, "")
    assert _colours(coloured), f"a terminal gets colour: {coloured!r}"
    for flags, extra in (([*args, "--no-color"], {}), (["--no-color", *args], {}), (args, {"NO_COLOR": "1"})):
        _, plain = _run_in_terminal(flags, dict(env, **extra), "")
        assert "~ partitions" in plain and not _colours(plain), (flags, extra, plain)
