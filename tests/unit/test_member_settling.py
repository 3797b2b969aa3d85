"""A member holding more partitions than its share takes few records a slot until the group settles.

The first member of a slice to join gets every partition, and gives some up as the others join;
a partition moves only once its task finished every record it took. With a slow handler and
full slot queues that held the partitions for seconds, so such a member keeps its slots' queues
short (``SETTLING_SLOT_RECORDS``) until it holds its share, or ``SETTLE_S`` after its assignment
last changed, so a group that never settles (tasks that run in turns) is not held back for good.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any

from test_partition_writes import _process

from queueplane.run.consumer.executor import member as member_module
from queueplane.run.consumer.executor.member import SETTLE_S, SETTLING_SLOT_RECORDS, GroupMember

SLOTS = 8
SLOT_QUEUE = 250


class _Member(GroupMember):
    """A member without its process's handler and clients: only its feed's bound is looked at."""

    def _new_process(self, settings: Any) -> Any:
        return SimpleNamespace(settings=settings)


def _member(tmp_path, monkeypatch, fair_share: int) -> GroupMember:
    monkeypatch.setattr(member_module, "journal_folder", lambda _group: tmp_path)
    settings = _process(tmp_path).settings
    settings = dataclasses.replace(settings, ordering="key", slots=SLOTS, slot_queue=SLOT_QUEUE, fair_share=fair_share)
    return _Member(settings)


def _assign(member: GroupMember, partitions: range, ago_s: float = 0.0) -> None:
    member._assigned = set(partitions)
    member._assigned_at = time.monotonic() - ago_s


def test_over_its_share_a_member_takes_few_records_a_slot(tmp_path, monkeypatch):
    member = _member(tmp_path, monkeypatch, fair_share=3)
    _assign(member, range(6))  # alone in the group so far: every partition
    assert member._limit() == SETTLING_SLOT_RECORDS * SLOTS
    _assign(member, range(3))  # the others joined: its share
    assert member._limit() == SLOT_QUEUE * SLOTS


def test_a_group_that_does_not_settle_holds_no_member_back_for_good(tmp_path, monkeypatch):
    member = _member(tmp_path, monkeypatch, fair_share=3)
    _assign(member, range(6), ago_s=SETTLE_S)
    assert member._limit() == SLOT_QUEUE * SLOTS


def test_without_a_known_share_a_member_takes_its_max_in_flight(tmp_path, monkeypatch):
    member = _member(tmp_path, monkeypatch, fair_share=0)
    _assign(member, range(6))
    assert member._limit() == SLOT_QUEUE * SLOTS
