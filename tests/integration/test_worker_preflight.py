"""A worker whose topics are not there fails at start, in one line, instead of idling green."""

from __future__ import annotations

import subprocess
import time

import pytest
from confluent_kafka.admin import AdminClient
from helpers import REPO
from worker_support import make_queue, worker_command

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize(
    ("group_type", "deleted", "what"),
    [("share", "topic", "queue topic"), ("consumer", "dlq", "dead-letter topic"), ("kmq", "markers", "markers topic")],
)
def test_a_worker_on_a_missing_topic_fails_at_once_naming_it(kafka, tmp_path, group_type, deleted, what):
    queue = make_queue(tmp_path, kafka, group_type=group_type)
    name = {"topic": queue.topic, "dlq": queue.dlq, "markers": f"{queue.topic}.markers"}[deleted]
    admin = AdminClient(dict(kafka.settings))
    admin.delete_topics([name])[name].result()
    deadline = time.monotonic() + 30
    while name in admin.list_topics(timeout=10).topics:  # deletion completes in the background
        assert time.monotonic() < deadline
        time.sleep(0.2)

    started = time.monotonic()
    result = subprocess.run(
        worker_command(queue, kafka, ("--until-idle", "60s")), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    took = time.monotonic() - started
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if name in line]
    assert len(lines) == 1 and what in lines[0] and "queueplane apply" in lines[0], result.stderr[-2000:]
    assert took < 30, f"failed after {took:.0f}s: it must not wait for a topic that is not there"
