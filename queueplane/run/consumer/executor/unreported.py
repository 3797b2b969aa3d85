"""Rows a group member committed that no time slice has collected yet, kept where its successors look.

A member commits a partition's finished prefix, and a slice collects that prefix's outcome rows
up to a second later. A handler that kills its process (``os._exit``, the OOM killer) in
between takes the rows with it, while the group will never hand those records out again: the
run would count fewer records than it finished. So before each commit the member writes, in a
file of its own in the queue's journal folder, the partition's offset range and how many rows
it holds; a slice that takes the rows clears what it took. A member that gets partitions
(``collect``, at each assignment) reads the files of processes that are gone, and counts as
``skipped`` the rows of each range below the group's committed offset for its partition: those
were committed, so they never come again; a range above it was not, and its records come again.

Kept as ranges and counts, not rows: on the quick path a member commits thousands a second.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from queueplane.run.executor.crash_journal import folder_lock, process_tag, replace_whole, tag_alive

SUFFIX = ".unreported"

Range = tuple[int, int, int, int]  # partition, first offset, offset after the last, rows


class Unreported:
    """One per member process: the ranges it committed whose rows are with it, not with Spark."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / f"{process_tag()}{SUFFIX}"
        self._lock = threading.Lock()
        self._ranges: dict[int, Range] = {}  # by a number of its own
        self._next = 0
        self._written: tuple[Range, ...] | None = None

    def committing(self, partition: int, first: int, end: int, rows: int) -> int:
        """A commit of ``[first, end)`` with ``rows`` rows is about to be made; its token."""
        with self._lock:
            self._next += 1
            token = self._next
            self._ranges[token] = (partition, first, end, rows)
            self._write()
        return token

    def failed(self, token: int) -> None:
        """The commit did not happen: the range's records come again, counted then."""
        self.reported([token])

    def reported(self, tokens: list[int]) -> None:
        """A slice took these ranges' rows: they are Spark's now."""
        if not tokens:
            return
        with self._lock:
            for token in tokens:
                self._ranges.pop(token, None)
            self._write()

    def _write(self) -> None:
        ranges = tuple(self._ranges.values())
        if ranges == self._written:
            return
        if ranges:
            replace_whole(self.path, json.dumps(ranges).encode())
        else:
            self.path.unlink(missing_ok=True)
        self._written = ranges

    def close(self) -> None:
        """A process that ends on its own has nothing unreported left (its last slice took it all)."""
        self.path.unlink(missing_ok=True)

    def collect(self, committed: Callable[[list[int]], dict[int, int | None]]) -> list[Range]:
        """The ranges dead processes committed and never reported, as far as the group's committed
        offsets (``committed``, per partition) say they were committed; their files removed."""
        found: list[Range] = []
        with folder_lock(self.folder):
            dead = [p for p in self.folder.glob(f"*{SUFFIX}") if not tag_alive(p.name[: -len(SUFFIX)])]
            if not dead:
                return found
            ranges: list[Range] = []
            for path in dead:
                try:
                    ranges += [tuple(r) for r in json.loads(path.read_bytes())]
                except (OSError, ValueError):
                    continue
            offsets = committed(sorted({r[0] for r in ranges})) if ranges else {}
            for partition, first, end, rows in ranges:
                mark = offsets.get(partition)
                if mark is not None and end <= mark:
                    found.append((partition, first, end, rows))
            for path in dead:
                path.unlink(missing_ok=True)
        return found
