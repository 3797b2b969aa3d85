"""What a scale-down waits for before it removes an executor: the share group's members, as the broker tells them."""

from __future__ import annotations

import time

import pytest
import yaml
from worker_support import make_queue

from queueplane.kafka import clients
from queueplane.run.driver.options import RunOptions
from queueplane.run.share.runtime import ShareRuntime
from queueplane.spec.model import build

pytestmark = pytest.mark.kafka


def _until(runtime: ShareRuntime, members: int, timeout_s: float = 30) -> int | None:
    deadline = time.monotonic() + timeout_s
    seen = runtime.group_members()
    while seen != members and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = runtime.group_members()
    return seen


def test_the_share_runtime_counts_the_consumers_in_its_group_until_they_leave(kafka, tmp_path):
    queue = make_queue(tmp_path, kafka)
    spec = build(yaml.safe_load(queue.spec_path.read_text()), str(queue.spec_path))
    runtime = ShareRuntime(spec, kafka, RunOptions())
    assert runtime.group_members() == 0, "no consumer has joined yet"

    consumers = [clients.share_consumer(kafka, {"group.id": queue.group}) for _ in range(2)]
    for consumer in consumers:
        consumer.subscribe([queue.topic])
    try:
        deadline = time.monotonic() + 30
        while runtime.group_members() != 2 and time.monotonic() < deadline:
            for consumer in consumers:  # a share consumer joins from its polls
                consumer.poll(0.1)
        assert runtime.group_members() == 2
        consumers.pop().close()
        assert _until(runtime, 1) == 1, "a closed consumer leaves the group at once"
    finally:
        for consumer in consumers:
            consumer.close()
    assert _until(runtime, 0) == 0
