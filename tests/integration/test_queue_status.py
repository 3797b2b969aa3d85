"""`queueplane status` against the real broker: an unapplied queue, then a consumer and a share queue with members."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from helpers import run_cli, wait_for
from specs_factory import dump, spec

from queueplane.kafka import clients
from queueplane.ops import dlq
from queueplane.provision import steps

pytestmark = pytest.mark.kafka


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(dump(doc))
    return path


def _status(path: Path, kafka, cli_env, *extra: str) -> dict:
    result = run_cli(["status", str(path), "--bootstrap-servers", kafka.bootstrap, "-o", "json", *extra], cli_env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _produce(kafka, topic: str, count: int) -> None:
    producer = Producer(dict(kafka.settings))
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=b"{}", partition=i % 3)
    assert producer.flush(30) == 0


def test_status_of_a_queue_not_applied_says_what_to_run(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    path = _write(tmp_path, spec("consumer", name=f"n-{tag}", group=f"gn-{tag}", topic=f"{tag}.new"))
    shown = _status(path, kafka, cli_env)
    assert (shown["partitions"], shown["lag"], shown["dead_letters"]) == (None, None, None)
    assert shown["group_state"] == "Dead" and shown["members"] == []
    text = run_cli(["status", str(path), "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert text.returncode == 0, text.stderr
    assert f"{tag}.new: not there; create it with `queueplane apply {path}`" in text.stdout


def test_status_shows_members_backlog_and_dead_letters(kafka, tmp_path, cli_env):
    tag = uuid.uuid4().hex[:8]
    consumer_spec = _write(tmp_path, spec("consumer", name=f"c-{tag}", group=f"gc-{tag}", topic=f"{tag}.orders"))
    share_spec = _write(tmp_path, spec("share", name=f"s-{tag}", group=f"gs-{tag}", topic=f"{tag}.jobs"))
    steps.apply(steps.plan([str(tmp_path)], kafka))
    _produce(kafka, f"{tag}.orders", 7)
    _produce(kafka, f"{tag}.orders.dlq", 2)

    member = clients.consumer(kafka, {"group.id": f"gc-{tag}", "client.id": "barista-1", "enable.auto.commit": False})
    sharer = clients.share_consumer(kafka, {"group.id": f"gs-{tag}", "client.id": "sharer-1"})
    try:
        member.subscribe([f"{tag}.orders"])
        sharer.subscribe([f"{tag}.jobs"])

        def joined(path: Path) -> dict | None:
            member.poll(0.2)  # nothing committed: the backlog stays whole
            sharer.poll(0.2)
            shown = _status(path, kafka, cli_env)
            members = shown["members"]
            assigned = members and all(m["partitions"] for m in members)  # assignments follow the join
            return shown if shown["group_state"] == "Stable" and assigned else None

        consumer_view = wait_for("the consumer to join its group", lambda: joined(consumer_spec), 30, every_s=0.5)
        assert [(m["client_id"], m["partitions"]) for m in consumer_view["members"]] == [("barista-1", [0, 1, 2])]
        assert (consumer_view["partitions"], consumer_view["lag"], consumer_view["dead_letters"]) == (3, 7, 2)
        assert consumer_view["oldest_waiting_s"] is not None and consumer_view["oldest_waiting_s"] >= 0

        share_view = wait_for("the share consumer to join its group", lambda: joined(share_spec), 30, every_s=0.5)
        assert [(m["client_id"], m["partitions"]) for m in share_view["members"]] == [
            ("sharer-1", list(range(share_view["partitions"])))
        ]
        assert share_view["dead_letters"] == 0
    finally:
        member.close()
        sharer.close()
    text = run_cli(["status", str(consumer_spec), "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert "backlog       7 record(s)" in text.stdout and f"2 pending in {tag}.orders.dlq" in text.stdout, text.stdout


def test_the_dlq_count_of_a_watched_worker_skips_transaction_markers_and_follows_new_dead_letters(kafka, tmp_path):
    tag = uuid.uuid4().hex[:8]
    path = _write(tmp_path, spec("consumer", name=f"t-{tag}", group=f"gt-{tag}", topic=f"{tag}.orders"))
    steps.apply(steps.plan([str(tmp_path)], kafka))
    (queue,) = steps.validate([str(path)], kafka)
    dlq_topic = f"{tag}.orders.dlq"
    producer = Producer({**kafka.settings, "transactional.id": f"eos-{tag}"})
    producer.init_transactions(30)

    def dead_letter(n: int) -> None:  # as an exactly-once worker writes them: a transaction each time
        for i in range(n):
            producer.begin_transaction()
            producer.produce(dlq_topic, key=f"k{i}".encode(), value=b"not json", partition=i % 3)
            producer.commit_transaction(30)

    dead_letter(5)
    count = dlq.DeadLetterCounter(kafka, queue)
    assert dlq.pending_by_offsets(kafka, queue) == 10, "offsets count each commit marker too"
    assert count() == 5
    dead_letter(2)
    assert count() == 7, "read again once the DLQ moved"
    estimate = dlq.DeadLetterCounter(kafka, queue, exact_up_to=3)
    assert estimate() == 14, "past the reading limit, the offsets"
