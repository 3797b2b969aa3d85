"""`queueplane lag` and `queueplane dlq list|redrive` against the real broker, run as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from helpers import REPO, run_cli, tagged_examples, unique_tag
from worker_support import make_queue, order, produce, read_all, run_worker, start_worker

from queueplane.handler_api import Record
from queueplane.kafka import clients
from queueplane.kafka.offsets import committed_offsets
from queueplane.run import dead_letters as dlq
from queueplane.run.dead_letters import Failure
from queueplane.run.outcomes import dead_letter_record

pytestmark = pytest.mark.kafka


def _produce_to(kafka, topic: str, records: list[tuple[int, bytes, bytes]]) -> None:
    producer = Producer(dict(kafka.settings))
    for partition, key, value in records:
        producer.produce(topic, value=value, key=key, partition=partition)
    assert producer.flush(30) == 0


def _commit(kafka, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({**kafka.settings, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    consumer.close()


def test_lag_matches_kafkas_own_group_tool_and_flags_the_hot_partition_and_key(kafka, tmp_path, cli_env):
    queue = make_queue(tmp_path, kafka, group_type="consumer", ordering="key", partitions=3)
    records = [(0, b"hot-customer", order(i)) for i in range(600)]
    records += [(p, f"k{i}".encode(), order(1000 + i)) for p in (1, 2) for i in range(50)]
    _produce_to(kafka, queue.topic, records)
    _commit(kafka, queue.group, queue.topic, {0: 100, 1: 20, 2: 50})

    result = run_cli(["lag", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap, "-o", "json"], cli_env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    by_partition = {row["partition"]: row for row in shown["partitions"]}

    tool = run_cli(["local", "kafka", "consumer-groups", "--describe", "--group", queue.group], cli_env)
    assert tool.returncode == 0, tool.stderr
    described = {}
    for line in tool.stdout.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] == queue.group and cells[1] == queue.topic:
            described[int(cells[2])] = (int(cells[3]), int(cells[4]), int(cells[5]))
    assert len(described) == 3
    for partition, (current, log_end, lag) in described.items():
        row = by_partition[partition]
        assert (row["committed"], row["log_end"], row["lag"]) == (current, log_end, lag)
    assert shown["total"] == sum(lag for _, _, lag in described.values()) == 500 + 30 + 0
    assert by_partition[0]["hot_partition"] and not by_partition[1]["hot_partition"]
    assert by_partition[0]["hot_key"] == "hot-customer" and by_partition[0]["hot_key_share"] == 1.0
    assert by_partition[1]["hot_key"] is None

    text = run_cli(["lag", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap], {**cli_env, "COLUMNS": "200"})
    assert "hot partition" in text.stdout and "hot key 'hot-customer'" in text.stdout


def test_share_lag_is_the_backlog_before_a_run_and_falls_while_the_worker_works_it_off(kafka, tmp_path, cli_env):
    total = 400
    queue = make_queue(tmp_path, kafka, group_type="share", partitions=2, concurrency=2)
    produce(kafka, queue.topic, [order(i, sleep_ms=40) for i in range(total)])

    def shown_lag() -> int | None:
        result = run_cli(["lag", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap, "-o", "json"], cli_env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["total"]

    assert shown_lag() == total, "a share group that never fetched lags by everything it will read"
    worker = start_worker(queue, kafka, "--until-idle", "4s")
    seen = []
    while worker.poll() is None:
        seen.append(shown_lag())
        time.sleep(0.5)
    assert worker.returncode == 0
    assert shown_lag() == 0
    during = [lag for lag in seen if lag is not None and 0 < lag < total]
    assert len(during) >= 2, f"the lag was seen between {total} and 0: {seen}"
    assert during == sorted(during, reverse=True), f"the lag only falls while no record arrives: {seen}"


def _dead_letters(queue, count: int, error_for=lambda i: "Reject") -> list[tuple[str, bytes, bytes, list]]:
    out = []
    for i in range(count):
        record = Record(
            key=f"k{i % 7}".encode(),
            value=order(i),
            headers=(("trace", b"t-%d" % i),),
            topic=queue.topic,
            partition=i % 2,
            offset=100 + i,
            delivery_count=3,
            timestamp=0,
        )
        out.append(dead_letter_record(record, queue.dlq, 3, Failure(error_for(i), "boom"), 1000, 2000))
    return out


def _write_dlq(kafka, records) -> None:
    producer = Producer(dict(kafka.settings))
    for topic, key, value, headers in records:
        producer.produce(topic, value=value, key=key, headers=headers)
    assert producer.flush(30) == 0


def _redrive_command(queue, kafka, *args: str) -> list[str]:
    spec = str(queue.spec_path)
    return [sys.executable, "-m", "queueplane", "dlq", "redrive", spec, "--bootstrap-servers", kafka.bootstrap, *args]


def _header(message, name: str) -> str | None:
    return next((v.decode() for k, v in message.headers() or [] if k == name), None)


@pytest.mark.parametrize("group_type", ["share", "kmq"])
def test_dead_letters_a_worker_wrote_are_redriven_after_the_fix_and_handled(kafka, tmp_path, cli_env, group_type):
    queue = make_queue(tmp_path, kafka, group_type=group_type, partitions=2, delivery_limit=2, lock="3s")
    refused = {10, 20, 30}
    produce(kafka, queue.topic, [order(i, mode="reject_until_fixed") if i in refused else order(i) for i in range(60)])
    first = run_worker(queue, kafka, "--until-idle", "4s")
    assert (first["counts"]["accepted"], first["counts"]["dlq"]) == (57, 3), first["counts"]

    (queue.folder / "fixed").touch()  # the team ships a handler that takes them
    cluster = ["--bootstrap-servers", kafka.bootstrap, "-o", "json"]
    redriven = run_cli(["dlq", "redrive", str(queue.spec_path), *cluster], cli_env)
    assert redriven.returncode == 0, redriven.stderr
    assert json.loads(redriven.stdout)["moved"] == 3
    second = run_worker(queue, kafka, "--until-idle", "4s")
    assert (second["counts"]["accepted"], second["counts"]["dlq"]) == (3, 0), second["counts"]
    assert second["lag_at_exit"] == 0, "the group moved past the redrive's transaction markers"
    outputs = [json.loads(m.value())["id"] for m in read_all(kafka, queue.output, expect_at_least=60)]
    assert sorted(outputs) == sorted(f"id-{i:06d}" for i in range(60)), "each record accepted once in the end"
    back = [m for m in read_all(kafka, queue.topic, expect_at_least=63) if _header(m, dlq.HEADER_REDRIVE_COUNT)]
    assert sorted(json.loads(m.value())["id"] for m in back) == [f"id-{i:06d}" for i in sorted(refused)]
    assert all(_header(m, dlq.HEADER_REDRIVE_FROM).startswith(f"{queue.dlq}/") for m in back)


@pytest.mark.parametrize("group_type", ["consumer", "share"])
def test_redrive_at_a_rate_killed_and_rerun_moves_each_record_back_once(kafka, tmp_path, cli_env, group_type):
    ordering = "key" if group_type == "consumer" else "none"
    queue = make_queue(tmp_path, kafka, group_type=group_type, ordering=ordering, partitions=2)
    _write_dlq(kafka, _dead_letters(queue, 50))
    group = f"{queue.group}.dlq-redrive"

    listed = run_cli(
        ["dlq", "list", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap, "-o", "json"], cli_env
    )
    assert listed.returncode == 0, listed.stderr
    shown = json.loads(listed.stdout)
    assert shown["pending"] == 50 and len(shown["records"]) == 50
    first = shown["records"][0]
    assert first["error_class"] == "Reject" and first["delivery_count"] == 3 and first["source"].startswith(queue.topic)

    first_run = subprocess.Popen(
        _redrive_command(queue, kafka, "--rate", "10"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    moved_before_kill = 0
    while time.monotonic() < deadline:
        moved_before_kill = sum(o or 0 for o in committed_offsets(kafka, group, queue.dlq, 2).values())
        if moved_before_kill >= 10:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # into the next transaction: some of its records are in the log, uncommitted
    os.killpg(first_run.pid, signal.SIGKILL)
    first_run.wait(30)
    # Each step moves records and commits their DLQ offsets in one transaction: what the group
    # committed is exactly what moved, and a transaction open at the kill is aborted.
    moved_before_kill = sum(o or 0 for o in committed_offsets(kafka, group, queue.dlq, 2).values())
    assert 10 <= moved_before_kill < 50, "the kill must land mid-way"

    started = time.time()
    rerun = subprocess.run(
        _redrive_command(queue, kafka, "--rate", "25", "-o", "json"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    report = json.loads(rerun.stdout)
    assert report["moved"] == 50 - moved_before_kill

    back = read_all(kafka, queue.topic, expect_at_least=50)
    ids = [json.loads(m.value())["id"] for m in back]
    assert sorted(ids) == sorted(f"id-{i:06d}" for i in range(50)), "each DLQ record back exactly once"
    for message in back:
        assert _header(message, dlq.HEADER_DELIVERY_COUNT) is None, "delivery count reset"
        assert _header(message, dlq.HEADER_ERROR_CLASS) is None
        assert _header(message, dlq.HEADER_REDRIVE_COUNT) == "1"
        assert _header(message, dlq.HEADER_REDRIVE_FROM).startswith(f"{queue.dlq}/")
        assert _header(message, "trace").startswith("t-"), "the record's own headers kept"
        i = int(json.loads(message.value())["id"][3:])
        assert message.partition() == i % 2, "back to the partition it came from"
    rerun_times = sorted(m.timestamp()[1] for m in back if m.timestamp()[1] >= started * 1000 - 50)
    if len(rerun_times) > 1:
        assert (rerun_times[-1] - rerun_times[0]) / 1000 >= (len(rerun_times) - 1) / 25 * 0.9, "rate limit held"

    positions = committed_offsets(kafka, group, queue.dlq, 2)
    ends = {
        p: Consumer({**kafka.settings, "group.id": "x"}).get_watermark_offsets(TopicPartition(queue.dlq, p))[1]
        for p in range(2)
    }
    assert positions == ends, "the DLQ position is at the end"
    after = run_cli(
        ["dlq", "list", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap, "-o", "json"], cli_env
    )
    assert json.loads(after.stdout)["pending"] == 0
    in_log = read_all(kafka, queue.topic, expect_at_least=51, committed_only=False)
    assert len(in_log) > 50, "a transaction was open at the kill: its records are in the log, aborted"
    # The worker reads committed only (share.isolation.level, Spark's source): the aborted copies
    # never reach the handler, and the group moves past the transaction markers (lag 0, so it stops).
    summary = run_worker(queue, kafka, "--until-idle", "4s")
    assert summary["counts"]["accepted"] == 50 and summary["lag_at_exit"] == 0, summary
    handled = sorted(e["id"] for e in queue.events() if e.get("result") == "ok")
    assert handled == sorted(f"id-{i:06d}" for i in range(50)), "each redriven record handled once"


def test_redrive_where_moves_only_matching_records_and_keeps_the_rest_pending(kafka, tmp_path, cli_env):
    queue = make_queue(tmp_path, kafka, group_type="consumer", partitions=2)
    _write_dlq(kafka, _dead_letters(queue, 9, error_for=lambda i: "Timeout" if i % 3 == 0 else "Reject"))
    result = run_cli(
        [
            "dlq",
            "redrive",
            str(queue.spec_path),
            "--bootstrap-servers",
            kafka.bootstrap,
            "--where",
            "error.class=Timeout",
            "-o",
            "json",
        ],
        cli_env,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["moved"] == 3 and json.loads(result.stdout)["kept"] == 6
    back = read_all(kafka, queue.topic, expect_at_least=3)
    assert sorted(json.loads(m.value())["id"] for m in back) == ["id-000000", "id-000003", "id-000006"]
    listed = json.loads(
        run_cli(
            ["dlq", "list", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap, "-o", "json"], cli_env
        ).stdout
    )
    assert listed["pending"] == 6 and {r["error_class"] for r in listed["records"]} == {"Reject"}

    bad = run_cli(
        ["dlq", "redrive", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap, "--where", "oops"], cli_env
    )
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr and "Traceback" not in bad.stderr


def test_redrive_writes_only_to_the_queues_own_topic_whatever_a_dlq_header_names(kafka, tmp_path, cli_env):
    queue = make_queue(tmp_path, kafka, group_type="consumer", partitions=2)
    victim = make_queue(tmp_path, kafka, group_type="consumer", partitions=2)
    forged = []
    for topic, key, value, headers in _dead_letters(queue, 4):
        headers = [(k, victim.topic.encode() if k == dlq.HEADER_SOURCE_TOPIC else v) for k, v in headers]
        forged.append((topic, key, value, headers))
    _write_dlq(kafka, forged)

    result = run_cli(
        ["dlq", "redrive", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap, "-o", "json"], cli_env
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["moved"], report["other_source"]) == (4, 4)
    back = read_all(kafka, queue.topic, expect_at_least=4)
    assert sorted(json.loads(m.value())["id"] for m in back) == [f"id-{i:06d}" for i in range(4)]
    assert read_all(kafka, victim.topic, expect_at_least=0, timeout_s=3) == []
    text = run_cli(["dlq", "redrive", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap], cli_env)
    assert text.returncode == 0 and "redrove 0 record(s)" in text.stdout


def test_commands_on_a_queue_that_is_not_there_say_what_is_missing_and_what_to_run(kafka, tmp_path, cli_env):
    spec = tagged_examples(tmp_path, unique_tag())["queue__cafe__coffee-orders"]  # never applied
    cluster = ["--bootstrap-servers", kafka.bootstrap]
    for command in (["lag"], ["dlq", "list"], ["dlq", "redrive"]):
        result = run_cli([*command, str(spec), *cluster], cli_env)
        assert result.returncode == 1, (command, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert "does not exist" in line and f"queueplane apply {spec}" in line, line
        assert "internal error" not in line

    assert run_cli(["apply", str(spec), "--yes", *cluster], cli_env).returncode == 0
    dlq_topic = yaml.safe_load(spec.read_text())["spec"]["topic"]["name"] + ".dlq"
    admin = clients.admin(kafka)  # held until the deletion is done: a dropped client aborts its requests
    admin.delete_topics([dlq_topic])[dlq_topic].result(30)
    for command in (["dlq", "list"], ["dlq", "redrive"]):
        deleted = run_cli([*command, str(spec), *cluster], cli_env)
        assert deleted.returncode == 1, (command, deleted.stderr)
        (line,) = deleted.stderr.strip().splitlines()
        assert f"the dead-letter topic {dlq_topic} does not exist" in line and "internal error" not in line, line
    status = run_cli(["status", str(spec), *cluster], cli_env)
    assert status.returncode == 0, status.stderr
    assert f"topic not there in {dlq_topic}" in status.stdout, status.stdout
    assert run_cli(["lag", str(spec), *cluster], cli_env).returncode == 0, "the queue topic itself is there"


def _member(kafka, group: str, topic: str, protocol: str) -> Consumer:
    """A subscribed member of ``group`` on ``protocol``, once the group gave it partitions."""
    member = Consumer({**kafka.settings, "group.id": group, "group.protocol": protocol})
    member.subscribe([topic])
    deadline = time.monotonic() + 60
    while not member.assignment():
        assert time.monotonic() < deadline, f"the {protocol} member of {group} got no partitions"
        member.poll(0.2)
    return member


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_lag_says_which_protocol_the_consumer_group_runs(kafka, tmp_path, cli_env, protocol):
    """Lag exporters and operators read a KIP-848 group and a classic one differently."""
    queue = make_queue(tmp_path, kafka, group_type="consumer", partitions=2)
    produce(kafka, queue.topic, [order(i) for i in range(10)])
    args = ["lag", str(queue.spec_path), "--bootstrap-servers", kafka.bootstrap]
    env = {**cli_env, "COLUMNS": "200"}

    # A group the broker does not know yet runs no protocol.
    before = run_cli([*args, "-o", "json"], env)
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["protocol"] is None
    assert "protocol" not in run_cli(args, env).stdout

    member = _member(kafka, queue.group, queue.topic, protocol)
    try:
        shown = run_cli([*args, "-o", "json"], env)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["protocol"] == protocol
        title = f"group {queue.group} (consumer, protocol {protocol}) on {queue.topic}"
        assert title in " ".join(run_cli(args, env).stdout.split()), "the table's title (wrapped to its width)"
    finally:
        member.close()
