"""What the fault tests check beyond "nothing lost": duplicates within what was in flight, and key order.

At-least-once allows duplicates, but only of records a fault caught between being handled and
being recorded as done on the broker. So a test reads each queue's progress on the broker as
every fault begins (``broker_progress``: the group's committed offsets, or a share group's
share-partition start offsets) and, afterwards, counts from the handler-call log the records
that fault could have caught (``in_flight``): those with a call begun before the fault ended, at
an offset at or past the progress read as it began. Progress read a moment early is only lower,
so the count is only larger; a record once behind the progress is never handed out again (a
consumer task skips what its group committed; a share partition's start offset passes only
acknowledged records; a kmq batch is committed only once its end markers are durable).

Key order is checked on the calls alone (``key_order_violation``): per key, offsets in call
order, where a duplicate may only come as a replay of a suffix of what the key already had.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from queueplane.kafka.offsets import committed_offsets
from queueplane.kafka.protocol import share_partition_offsets
from queueplane.kafka.target import KafkaTarget

# The queues both fault tests run side by side: runtime -> (group type, exactlyOnce, ordering).
RUNTIMES = {
    "share": ("share", False, "none"),
    "consumer": ("consumer", False, "none"),
    "consumer-by-key": ("consumer", False, "key"),
    "consumer-exactly-once": ("consumer", True, "none"),
    "kmq": ("kmq", False, "none"),
}


def broker_progress(target: KafkaTarget, group_type: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Per partition, the first offset the broker does not hold as done for ``group``: 0 where it holds nothing.

    Consumer groups and kmq (whose driver commits a batch once its end markers are durable): the
    group's committed offset. Share groups: the share-partition start offset (every record
    before it is acknowledged).
    """
    if group_type != "share":
        return {p: offset or 0 for p, offset in committed_offsets(target, group, topic, partitions).items()}
    for attempt in range(10):  # a coordinator moving on a busy broker: a moment later it answers
        try:
            starts = share_partition_offsets(target.settings, group, topic, list(range(partitions)))
            return {p: starts.get(p, (None, None))[0] or 0 for p in range(partitions)}
        except ConnectionError:
            if attempt == 9:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


@dataclass
class Fault:
    """One fault: each queue's progress on the broker as it began, and when it ended (epoch seconds)."""

    name: str
    progress: dict[str, dict[int, int]]
    ended_at: float | None = None


@dataclass
class FaultLog:
    """The faults of a run, for ``in_flight``. ``queues``: name -> (group type, group, topic, partitions)."""

    target: KafkaTarget
    queues: dict[str, tuple[str, str, str, int]]
    faults: list[Fault] = field(default_factory=list)

    def begins(self, name: str) -> None:
        """Read every queue's progress now: call it just before the fault starts, while the broker answers."""
        progress = {q: broker_progress(self.target, *where) for q, where in self.queues.items()}
        self.faults.append(Fault(name, progress))

    def begins_before_any_work(self, name: str) -> None:
        """A fault before the workers took anything: no progress to read, none needed."""
        self.faults.append(Fault(name, {q: {} for q in self.queues}))

    def ended(self) -> None:
        self.faults[-1].ended_at = time.time()

    def in_flight(self, queue: str, events: Iterable[dict]) -> set[str]:
        """The record ids any of the faults could have caught on ``queue`` (see ``in_flight``)."""
        return in_flight(events, [(f.progress[queue], f.ended_at) for f in self.faults])


def in_flight(events: Iterable[dict], faults: Sequence[tuple[dict[int, int], float | None]]) -> set[str]:
    """Ids of the records a fault caught between handling and the broker's progress.

    ``faults``: (progress per partition as the fault began, when it ended). A record is caught
    by a fault when one of its calls began before the fault ended, at an offset at or past that
    partition's progress: handled then, or taken to be handled, and not recorded as done. Calls
    are the handler's log lines (``offset``, ``partition``, ``start``, ``id``); a line without
    an id (a value that is not JSON) names no record.
    """
    caught: set[str] = set()
    for event in events:
        if event.get("id") is None:
            continue
        for progress, ended_at in faults:
            assert ended_at is not None, "a fault that never ended"
            if event["start"] < ended_at and event["offset"] >= progress.get(event["partition"], 0):
                caught.add(event["id"])
                break
    return caught


def duplicate_excess(outputs: Sequence[str], caught: set[str]) -> str | None:
    """Why the outputs' duplicates exceed what was in flight at the faults, or None when they do not.

    A duplicate is an output beyond a record's first. Their number may not exceed the records
    in flight; the message names the bound and the duplicated records outside it.
    """
    duplicates = len(outputs) - len(set(outputs))
    if duplicates <= len(caught):
        return None
    seen: set[str] = set()
    again = {o for o in outputs if o in seen or seen.add(o)}
    outside = sorted(again - caught)
    return (
        f"{duplicates} duplicate outputs, above the {len(caught)} records in flight at the faults; "
        f"{len(again)} records duplicated, {len(outside)} of them not in flight, e.g. {outside[:5]}"
    )


def key_order_violation(offsets: Sequence[int]) -> str | None:
    """Why one key's handled offsets, in call order, break key order; None when they keep it.

    The rule, after folding consecutive calls of one offset into one (a retry in place):

    - an offset handled for the first time is above every offset the key had before;
    - an offset handled again starts a replay: it goes back (at or below the offset before it),
      and from there the replay brings every offset the key had, in order, none skipped, up to
      the highest one; only then may a new offset come;
    - a replay may be cut short only by another replay (a second fault), not by a new offset or
      by the end of the calls.

    So the sequence is increasing runs, each later run starting at or before the end of the one
    before it and replaying a whole suffix of what was handled.
    """
    handled: list[int] = []  # distinct offsets so far, ascending: a new one is always the highest
    replay_next: int | None = None  # during a replay: index in ``handled`` of the offset it owes next
    replay_from: int | None = None
    previous: int | None = None
    for offset in offsets:
        if offset == previous:
            continue
        at = bisect.bisect_left(handled, offset)
        seen = at < len(handled) and handled[at] == offset
        if not seen:
            if handled and offset < handled[-1]:
                return f"offset {offset} handled for the first time after offset {handled[-1]}"
            if replay_next is not None and replay_next < len(handled):
                return f"the replay from offset {replay_from} skipped offset {handled[replay_next]} for {offset}"
            handled.append(offset)
            replay_next = replay_from = None
        elif replay_next is not None and replay_next < len(handled) and handled[replay_next] == offset:
            replay_next += 1
        elif previous is not None and offset < previous:
            replay_next, replay_from = at + 1, offset
        else:  # forward, to an offset handled before, past the one the replay owes
            assert replay_next is not None
            return f"the replay from offset {replay_from} skipped offset {handled[replay_next]} for {offset}"
        previous = offset
    if replay_next is not None and replay_next < len(handled):
        return f"the replay from offset {replay_from} ended before offset {handled[replay_next]}"
    return None


def key_order_violations(events: Iterable[dict]) -> list[str]:
    """Every key whose calls break key order, with why. Calls are ordered by when they began; a
    key's records share a partition, so its offsets compare. A hung call logs a ``started`` line
    and its final line with one start: folded like a retry in place."""
    calls: dict[tuple[int, str | None], list[tuple[float, int]]] = defaultdict(list)
    for event in events:
        calls[event["partition"], event["key"]].append((event["start"], event["offset"]))
    found = []
    for (partition, key), started in sorted(calls.items(), key=lambda item: str(item[0])):
        offsets = [offset for _, offset in sorted(started)]
        why = key_order_violation(offsets)
        if why is not None:
            found.append(f"key {key!r} of partition {partition}: {why} (offsets in call order: {_excerpt(offsets)})")
    return found


def _excerpt(offsets: list[int], width: int = 40) -> str:
    return str(offsets) if len(offsets) <= width else f"{offsets[:width]}... ({len(offsets)} calls)"
