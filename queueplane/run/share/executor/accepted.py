"""The records a share process accepted lately, so that a delivery of one again is accepted
without a handler call.

An acknowledgement can be given and still not land. Most ride on the consumer's next share
fetch, and a connection reset or stalled on the way loses them; the broker then delivers those
records again, one delivery higher, once their locks run out. Handled again, each is a
duplicate output, and one accepted on its last handler delivery comes back on a reserve
delivery and would go to the DLQ as ``DeliveryLimitReached`` although its handler accepted it
(docs/runtimes.md, "Nothing archived outside the DLQ").

So a process remembers, for ``keep_s``, the records whose acceptance it counted: a redelivery
of one of them to the same process is acknowledged ACCEPT again, with no call and no row (the
first acceptance counted it). A redelivery that goes to another process is handled again.
Records whose commit answered that it did not record them are not remembered:
their rows were dropped, and their next handling counts them (queueplane.run.share.executor.outbox).

Kept as offset runs per partition, in two generations of ``keep_s`` each: the accepted rows are
such runs already (outcomes.py), a poll's records nearly always one, so a process accepting tens
of thousands of records a second holds a few hundred runs a second, and a lookup, done only for
records delivered again, is a binary search.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence

from queueplane.run.outcomes import (
    ACCEPTED,
    LAST_OFFSET_COLUMN,
    OFFSET_COLUMN,
    OUTCOME_COLUMN,
    PARTITION_COLUMN,
    OutcomeColumns,
)

# Runs of a partition: [first, last] offsets, inclusive; sorted by first when ``sorted`` says so.
Runs = list[list[int]]


class _Generation:
    def __init__(self, since: float):
        self.since = since
        self.runs: dict[int, Runs] = {}
        self.sorted = True

    def add(self, partition: int, first: int, last: int) -> None:
        runs = self.runs.setdefault(partition, [])
        if runs and runs[-1][1] + 1 == first:  # the next poll of the same partition: one run longer
            runs[-1][1] = last
            return
        if runs and runs[-1][0] > first:
            self.sorted = False
        runs.append([first, last])

    def holds(self, partition: int, offset: int) -> bool:
        runs = self.runs.get(partition)
        if not runs:
            return False
        if not self.sorted:
            for kept in self.runs.values():
                kept.sort()
            self.sorted = True
        at = bisect.bisect_right(runs, [offset, float("inf")]) - 1
        return at >= 0 and runs[at][1] >= offset


class AcceptedLately:
    """(partition, offset)s this process accepted in the last ``keep_s`` at least (twice that at most)."""

    def __init__(self, keep_s: float, clock: Callable[[], float] = time.monotonic):
        self.keep_s = keep_s
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._old = _Generation(now - keep_s)
        self._new = _Generation(now)

    def note(self, blocks: list[OutcomeColumns]) -> None:
        """The accepted records among outcome rows that count (each record once in a block): an
        accepted row is a run of consecutive offsets already (outcomes.py), noted as it is."""
        spans = [
            (partition, first, last)
            for block in blocks
            for partition, first, last, outcome in zip(
                block[PARTITION_COLUMN],
                block[OFFSET_COLUMN],
                block[LAST_OFFSET_COLUMN],
                block[OUTCOME_COLUMN],
                strict=True,
            )
            if outcome == ACCEPTED
        ]
        if not spans:
            return
        with self._lock:
            generation = self._current()
            for partition, first, last in spans:
                generation.add(partition, first, last)

    def find(self, records: Sequence[tuple[int, int]]) -> set[int]:
        """Which of ``records`` (partition, offset) this process accepted lately: their indices."""
        with self._lock:
            self._current()
            generations = (self._new, self._old)
            return {
                i
                for i, (partition, offset) in enumerate(records)
                if any(g.holds(partition, offset) for g in generations)
            }

    def _current(self) -> _Generation:
        """The generation taking notes, the oldest dropped once the newest is ``keep_s`` old."""
        now = self._clock()
        if now - self._new.since >= self.keep_s:
            self._old, self._new = self._new, _Generation(now)
            if now - self._old.since >= 2 * self.keep_s:  # nothing noted for a whole generation
                self._old = _Generation(now - self.keep_s)
        return self._new
