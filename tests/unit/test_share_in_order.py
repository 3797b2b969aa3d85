"""Early acknowledgements of a share poll go in offset order, per partition (share/executor/fetcher.py's InOrder)."""

from __future__ import annotations

from confluent_kafka import Message

from queueplane.run.outcomes import RELEASED
from queueplane.run.share.executor.fetcher import InOrder
from queueplane.run.share.settings import ACCEPTED_RESULT


def _poll(partitions: list[int]) -> list[Message]:
    offsets: dict[int, int] = {}
    messages = []
    for p in partitions:
        offsets[p] = offsets.get(p, -1) + 1
        messages.append(Message(topic="t", partition=p, offset=offsets[p], value=b""))
    return messages


def test_a_partitions_run_stops_at_its_first_record_still_running_and_others_go_on():
    messages = _poll([0, 0, 0, 1, 1, 1])
    in_order = InOrder(messages)
    results = [ACCEPTED_RESULT, None, ACCEPTED_RESULT, None, ACCEPTED_RESULT, ACCEPTED_RESULT]
    assert in_order.accepted(results) == [0]  # partition 0 waits for its record 1; partition 1 for its first
    results[3] = ACCEPTED_RESULT
    assert in_order.accepted(results) == [3, 4, 5]
    results[1] = ACCEPTED_RESULT
    assert in_order.accepted(results) == [1, 2]
    assert in_order.accepted(results) == []
    assert in_order.left() == []


def test_what_is_left_is_every_record_not_acknowledged_early_in_poll_order():
    messages = _poll([0, 1, 0, 1, 2])
    in_order = InOrder(messages)
    assert in_order.left() == [0, 1, 2, 3, 4]
    failed = (RELEASED, None, 0.0)
    results = [ACCEPTED_RESULT, failed, ACCEPTED_RESULT, ACCEPTED_RESULT, None]
    assert in_order.accepted(results) == [0, 2]  # partition 1's released record is acknowledged at the end
    assert in_order.left() == [1, 3, 4]
