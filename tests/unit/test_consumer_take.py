"""A member feeds its partitions without waiting on a busy slot (PartitionTask.take).

The member's one thread polls, feeds every partition it holds and commits. A slot whose queue
is full must not hold that thread: ``take`` feeds only the prefix of a partition's records the
slots have room for, and says how many; the rest waits with the member. No broker: the process
is the stand-in of test_partition_writes, and the handler blocks until the test lets it go.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from test_partition_writes import _process

from queueplane.handler_api import Record
from queueplane.run.consumer.executor.ordering import key_slot
from queueplane.run.consumer.executor.partition import PartitionTask
from queueplane.run.consumer.executor.slots import Slot

SLOTS = 4


def _keys_in_slots() -> dict[int, bytes]:
    """One key per slot."""
    found: dict[int, bytes] = {}
    for i in range(1000):
        key = b"customer-%d" % i
        found.setdefault(key_slot(key, SLOTS), key)
        if len(found) == SLOTS:
            return found
    raise AssertionError("no key for every slot")


def test_a_full_slot_stops_the_feed_at_its_next_record_without_waiting(tmp_path):
    process = _process(tmp_path)
    process.settings = dataclasses.replace(process.settings, ordering="key", slots=SLOTS, slot_queue=8)
    gate = threading.Event()
    process.handler = lambda record: gate.wait(30) and record.value
    keys = _keys_in_slots()
    task = PartitionTask(process, "q", 0)
    try:
        room = Slot.DEPTH * task.chunk  # records a slot's queue takes beside the chunk in its hands
        busy, other = keys[0], keys[1]
        # The busy slot's first chunk goes to its thread (stuck in the handler), then its queue fills.
        records = [Record(busy, b"v", (), "q", 0, offset, 1, 0) for offset in range(task.chunk + room)]
        offset = len(records)
        records += [Record(busy, b"v", (), "q", 0, offset, 1, 0), Record(other, b"v", (), "q", 0, offset + 1, 1, 0)]
        first = records[: task.chunk]
        assert task.take(first) == len(first)
        deadline = time.monotonic() + 10
        while task.slots[0].queue.qsize() and time.monotonic() < deadline:
            time.sleep(0.01)  # the slot took its chunk: it waits in the handler
        rest = records[task.chunk :]
        started = time.monotonic()
        taken = task.take(rest)
        assert time.monotonic() - started < 1.0, "take waited for the busy slot"
        assert taken == room, "the queue's room, then the busy slot's next record stops the feed"
        assert task.take(rest[taken:]) == 0, "still full: nothing taken, not even the other slot's record"
        gate.set()
        deadline = time.monotonic() + 10
        left = rest[taken:]
        while left and time.monotonic() < deadline:
            left = left[task.take(left) :]
            time.sleep(0.01)
        assert not left, "once the slot worked through its queue, the rest was taken in order"
    finally:
        gate.set()
        task.abandon()
