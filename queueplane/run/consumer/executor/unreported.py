"""Rows a group member committed that Spark does not have yet, kept where its successors look.

A member commits a partition's finished prefix, and a slice (a micro-batch task) collects that
prefix's outcome rows up to a second later; Spark has them only once that task has ended. A
handler that kills its process (``os._exit``, the OOM killer) in between takes the rows with it,
while the group will never hand those records out again: the run would count fewer records than
it finished. So before each commit the member writes, in a file of its own in the queue's
journal folder, the partition's offset range and how many rows it holds.

- **Not yet taken** by a slice: a member that gets partitions (``collect``, at each assignment),
  and any member that sees a dead process's file while it runs, counts as ``skipped`` the rows of
  each range below the group's committed offset for its partition: those were committed, so they
  never come again; a range above it was not, and its records come again. A dead process commits
  nothing more, so the count does not depend on when it is made: the group may finish the queue,
  and the run end, before anyone is given the dead process's partitions.
- **Handed** to a slice (``handed``): the rows are in that task's output, which Spark keeps only
  if the task succeeds. A task whose process died is run again, with the same slice: that retry
  (``slice_started``) counts the ranges handed to its slice as ``skipped`` and holds them in turn.
  A task that succeeded is never run again, and once its process runs its next task its ranges
  are dropped; those of a dead process go once a later batch of the run starts, or after
  ``HANDED_KEPT_S``.

Kept as ranges and counts, not rows: on the quick path a member commits thousands a second.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from queueplane.run.executor.crash_journal import dead_process_files, folder_lock, process_tag, replace_whole

SUFFIX = ".unreported"
# How long ranges a dead process handed to a slice wait for that slice's retry, at most: Spark
# runs a failed task again within seconds, and the next batch only after it.
HANDED_KEPT_S = 600.0

Range = tuple[int, int, int, int]  # partition, first offset, offset after the last, rows


@dataclass(frozen=True)
class SliceId:
    """A micro-batch task: the run (one query's reader) it belongs to, its batch and its index.
    A retry of the task has the same id."""

    run: str
    batch: int
    index: int

    def text(self) -> str:
        return f"{self.run}:{self.batch}:{self.index}"

    @classmethod
    def parse(cls, text: str) -> SliceId | None:
        run, _, rest = text.rpartition(":")
        run, _, batch = run.rpartition(":")
        try:
            return cls(run, int(batch), int(rest))
        except ValueError:
            return None


@dataclass
class _Note:
    range: Range
    handed_to: str | None = None  # the slice (SliceId.text) whose output holds its rows
    handed_at: float = 0.0  # wall-clock seconds

    def entry(self) -> list:
        return [*self.range, self.handed_to, self.handed_at] if self.handed_to else list(self.range)

    @classmethod
    def of(cls, entry: list) -> _Note:
        p, first, end, rows = (int(v) for v in entry[:4])
        handed_to = str(entry[4]) if len(entry) > 4 and entry[4] else None
        return cls((p, first, end, rows), handed_to, float(entry[5]) if handed_to and len(entry) > 5 else 0.0)


def _expired(note: _Note, current: SliceId | None, now: float) -> bool:
    """A handed range no retry will claim: its slice's batch is over, or it waited too long."""
    if now - note.handed_at > HANDED_KEPT_S:
        return True
    handed = SliceId.parse(note.handed_to or "")
    return handed is None or (current is not None and handed.run == current.run and handed.batch < current.batch)


class Unreported:
    """One per member process: the ranges it committed whose rows Spark does not have yet."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / f"{process_tag()}{SUFFIX}"
        self._lock = threading.Lock()
        self._notes: dict[int, _Note] = {}  # by a number of its own
        self._next = 0
        self._written: tuple[tuple, ...] | None = None
        self._current: SliceId | None = None  # the slice this process runs or ran last

    def committing(self, partition: int, first: int, end: int, rows: int) -> int:
        """A commit of ``[first, end)`` with ``rows`` rows is about to be made; its token."""
        with self._lock:
            return self._add(_Note((partition, first, end, rows)))

    def _add(self, note: _Note) -> int:
        self._next += 1
        self._notes[self._next] = note
        self._write()
        return self._next

    def failed(self, token: int) -> None:
        """The commit did not happen: the range's records come again, counted then."""
        with self._lock:
            self._notes.pop(token, None)
            self._write()

    def handed(self, tokens: list[int], slice_id: SliceId) -> None:
        """These ranges' rows are in the output of ``slice_id``'s task."""
        if not tokens:
            return
        with self._lock:
            for token in tokens:
                note = self._notes.get(token)
                if note is not None:
                    note.handed_to, note.handed_at = slice_id.text(), time.time()
            self._write()

    def slice_started(self, slice_id: SliceId) -> list[Range]:
        """A task of ``slice_id`` starts in this process. The task this process ran before it has
        ended, so what it was handed is Spark's (a task fails once its rows are out only when its
        process dies); what a dead process (or this one) handed to an earlier attempt of this very
        slice is not, and is returned to be counted here, and held by this attempt in turn."""
        mine = slice_id.text()
        claimed: list[_Note] = []
        with self._lock:
            self._current = slice_id
            for token, note in list(self._notes.items()):
                if note.handed_to is not None:
                    del self._notes[token]
                    if note.handed_to == mine:
                        claimed.append(note)
            if self.dead_left():
                with folder_lock(self.folder):
                    for path, notes in self._dead_files():
                        left = []
                        for note in notes:
                            if note.handed_to == mine:
                                claimed.append(note)
                            elif note.handed_to is None or not _expired(note, slice_id, time.time()):
                                left.append(note)
                        self._write_dead(path, notes, left)
            now = time.time()
            for note in claimed:
                self._next += 1
                self._notes[self._next] = _Note(note.range, mine, now)
            self._write()
        return [note.range for note in claimed]

    def _write(self) -> None:
        entries = tuple(tuple(note.entry()) for note in self._notes.values())
        if entries == self._written:
            return
        if entries:
            replace_whole(self.path, json.dumps(entries).encode())
        else:
            self.path.unlink(missing_ok=True)
        self._written = entries

    def close(self) -> None:
        """A process that ends on its own has nothing unreported left (its last slice took it all)."""
        self.path.unlink(missing_ok=True)

    def dead_left(self) -> bool:
        """Whether a process that is gone left a file here (read without the lock: a hint)."""
        return bool(dead_process_files(self.folder, SUFFIX, self.path))

    def _dead_files(self) -> list[tuple[Path, list[_Note]]]:
        """The files of processes that are gone, and their notes (under the folder's lock)."""
        found: list[tuple[Path, list[_Note]]] = []
        for path in dead_process_files(self.folder, SUFFIX, self.path):
            try:
                found.append((path, [_Note.of(entry) for entry in json.loads(path.read_bytes())]))
            except (OSError, ValueError, TypeError, IndexError):
                path.unlink(missing_ok=True)
        return found

    @staticmethod
    def _write_dead(path: Path, notes: list[_Note], left: list[_Note]) -> None:
        if not left:
            path.unlink(missing_ok=True)
        elif len(left) != len(notes):
            replace_whole(path, json.dumps([note.entry() for note in left]).encode())

    def collect(self, committed: Callable[[list[int]], dict[int, int | None]]) -> list[Range]:
        """The ranges dead processes committed and no slice took, as far as the group's committed
        offsets (``committed``, per partition) say they were committed. What they handed to a
        slice stays for that slice's retry until it expires."""
        found: list[Range] = []
        with folder_lock(self.folder):
            dead = self._dead_files()
            taken = [note.range for _, notes in dead for note in notes if note.handed_to is None]
            offsets = committed(sorted({r[0] for r in taken})) if taken else {}
            for partition, first, end, rows in taken:
                mark = offsets.get(partition)
                if mark is not None and end <= mark:
                    found.append((partition, first, end, rows))
            now = time.time()
            for path, notes in dead:
                left = [n for n in notes if n.handed_to is not None and not _expired(n, self._current, now)]
                self._write_dead(path, notes, left)
        return found
