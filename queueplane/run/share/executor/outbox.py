"""The outcome rows a share process settled and has not yet handed to a micro-batch, kept on disk too.

A share fetcher acknowledges a record as soon as its outcome is durable, and the row saying so
waits in the process for the next micro-batch (a time slice, seconds). A process that dies
meanwhile (a handler's ``os._exit``, its memory limit) took those rows with it: the records
are settled on the broker but missing from the run's counts and metrics. So each block of rows
is also appended to a file per process; the next process of the queue on the machine takes over
the files of dead processes and hands their rows on.

A batch's task takes the rows, and they stay in the file until Spark has them: a process can die
between the take and the task's end (the memory guard ends it, a handler kills it), and Spark
then runs the task again in another process, which would find nothing. So a take only appends a
mark, "the rows settled so far are handed to task T" (T: the query's stream, the batch, the
task's slot), and those rows leave the file when the process's next task starts: Spark starts
another task in a Python worker only once the last one ended. A process that dies with a mark in
its file may have died before its task ended or after (idle, between two tasks; the common case),
and which one is told by the task of the process that takes the file over:

- a task of the same slot and batch: the marked task failed, this is its retry, and the rows are
  handed again (to the task that is running, or to its process's next one);
- a later batch of the same stream, or another stream (a new query, whose batches count from one
  again): the marked task ended, as every task of a batch does before the next batch starts, and
  Spark has the rows; they are dropped;
- another slot of the same batch, or a later one: not known yet. The rows go to the folder's
  ``handed.jsonl`` (under its lock), where every take looks: the retry of the task finds them
  there, and the first task of a later batch drops them.

A process that runs the same task again itself (the task failed after its Python worker had
given Spark the rows, and Spark retried it in the same worker) hands the rows again too. The
batch numbers and the stream come from the source's offsets (source.py), which a restart from
the query's checkpoint keeps: a batch run again after such a restart has its rows handed again,
as none of that batch's rows were committed.

Rows of records accepted while their poll runs are written *provisional*, before the commit of
their acknowledgements, and settled when the commit answers: confirmed for the partitions it
recorded, dropped for the others, or all dropped when it failed (the broker delivers those
records again, and their next handling counts them). Written after the commit, they were lost
with a process killed during its round trip, their records acknowledged and never counted;
written as settled before it, a commit that did not land counted its records twice. A batch
takes no provisional row.

A provisional block in a dead process's file that was never settled has an unknown fate: its
commit may have landed (the records are done, and nobody will count them again) or not (the
broker delivers them again). It is handed on as counted, since a commit that was sent usually
lands, and its records are registered in the folder's ``counted.json`` (partition, offset and
delivery count, under the folder's lock, for DELIVERY_MEMORY_S): a later delivery of one of
them to a process of the queue on this machine is acknowledged without a handler call and
without a row (``redelivered_counted``). A redelivery that goes to a process on another machine
is handled again and counted twice: that is the one case left.

A settled row is no proof that the broker has its record's acknowledgement either: the rows of
a poll's last records are written (``add``) when their acknowledgements are given, and those
ride on the fetcher's next poll (fetcher.py); a process killed before that poll took them to
the broker leaves settled rows of records it delivers again. A living process knows its own
(``AcceptedLately``); a dead one's memory went with it. So the accepted and dead-lettered records
of every row a dead process's file holds, settled, unsettled or handed to a task, are registered
the same way, each with its outcome: a dead-lettered one delivered again is acknowledged REJECT,
its DLQ copy written already (``dead_lettered``). A released one is not registered: it is
handled again.

A process takes a dead one's file over by renaming it to ``<owner>.outbox.<claimer>`` before it
reads it, so no two processes hand the same rows on. A claimer that dies before the rows are in
its own file leaves the claimed file behind, and the next process takes it over the same way.
One that dies between writing them into its own file (or ``handed.jsonl``) and removing the claimed
one hands them on twice: those two system calls are the window.

The files are the queue's folder's (queueplane.run.executor.private_dirs: 0700, this user's, checked on
open), and what they hold is data: JSON lines, each parsed and checked against the outcome
columns' types, never code to run. A reader stops at a line it cannot take (cut short, or not
one this module writes) and hands on what came before it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from queueplane.run.executor.crash_journal import (
    DELIVERY_MEMORY_S,
    PARTIAL_SUFFIX,
    file_stamp,
    folder_lock,
    process_tag,
    replace_whole,
    tag_alive,
)
from queueplane.run.executor.private_dirs import private_dir
from queueplane.run.outcomes import (
    ACCEPTED,
    DEAD_LETTERED,
    LAST_OFFSET_COLUMN,
    LATENCY_SLOTS,
    OFFSET_COLUMN,
    OUTCOME_ARROW,
    PARTITION_COLUMN,
    RECORDS_COLUMN,
    TOPIC_COLUMN,
    OutcomeColumns,
    each_record,
)

log = logging.getLogger("queueplane.worker")

SUFFIX = ".outbox"
COUNTED = "counted.json"  # records handed on as counted whose commit may not have landed
HANDED = "handed.jsonl"  # rows a dead process handed to a task that may still be run again

# The entries of a process's file, each one line of JSON: [kind, token, payload].
ROWS = 0  # settled rows: payload is a list of blocks
PROVISIONAL = 1  # rows whose commit has not answered: payload is a list of blocks
CONFIRM = 2  # the commit answered: the token's rows count, except those of payload's (topic, partition)s
DROP = 3  # the commit failed: the token's rows are dropped
TAKEN = 4  # the settled rows so far are handed to a task: payload is the task

# (topic, partition)s whose acknowledgements a commit did not record; None: the commit failed.
Unrecorded = Collection[tuple[str, int]] | None

# A micro-batch's task: (stream, batch, slot). The stream names the query (kept by its checkpoint);
# batches count up within it; a task run again has the same slot and batch.
Task = tuple[str, int, int]

# What became of rows a dead process handed to a task (``_fate``).
RECEIVED = "received"  # the task ended: Spark has them
LOST = "lost"  # the task is being run again: hand them again
UNKNOWN = "unknown"  # the task may still be run again


def _fate(handed_to: Task, current: Task | None) -> str:
    """What became of rows a process that died had handed to ``handed_to``, judged by the task this
    process runs (or ran last), ``current``: one attempt of a task runs at a time, and a batch
    starts once every task of the one before it ended."""
    if current is None:
        return UNKNOWN
    if handed_to[0] != current[0] or handed_to[1] < current[1]:
        return RECEIVED
    if handed_to == current:
        return LOST
    return UNKNOWN


class Outbox:
    """Rows settled and not yet taken, in memory and in ``<folder>/<process>.outbox``."""

    def __init__(self, folder: Path, tag: str | None = None):
        """``tag`` names the file (``process_tag()``, this process's); a test may pose as another process."""
        self.folder = folder
        private_dir(folder)  # made 0700, or refused when another user could have written in it
        self.path = folder / f"{tag or process_tag()}{SUFFIX}"
        self._lock = threading.Lock()
        self._blocks: list[OutcomeColumns] = []
        # token → (blocks, their entry as written, kept to write them anew without encoding them again)
        self._provisional: dict[int, tuple[list[OutcomeColumns], bytes]] = {}
        self._tokens = itertools.count(1)
        self._file = self.path.open("ab", buffering=0)
        self._counted: dict[tuple[int, int], Counted] = {}  # counted.json as last read
        self._counted_seen: tuple[int, int, int] | None = None
        self._task: Task | None = None  # the task this process runs, or ran last (``begin``)
        # The rows of the last mark in the file (``take``), until the next task starts.
        self._handed: list[OutcomeColumns] = []
        self._handed_to: Task | None = None  # None: no mark in the file
        self._after_mark = 0  # the file's length after that mark
        self._open_at_mark: list[bytes] = []  # the provisional entries not settled when it was written
        self._handed_seen: tuple[tuple[int, int, int] | None, Task | None] | None = None

    def add(self, blocks: list[OutcomeColumns]) -> None:
        """Rows settled by one fetcher cycle: one write, before the fetcher's next poll."""
        data = _entry(ROWS, 0, blocks)
        with self._lock:
            self._blocks.extend(blocks)
            self._file.write(data)

    def add_provisional(self, blocks: list[OutcomeColumns]) -> int:
        """Rows of records whose acknowledgements are about to be committed: one write; a token for ``settle``."""
        token = next(self._tokens)  # one step under the interpreter lock: each token once
        data = _entry(PROVISIONAL, token, blocks)
        with self._lock:
            self._provisional[token] = (blocks, data)
            self._file.write(data)
        return token

    def settle(self, token: int, unrecorded: Unrecorded) -> list[OutcomeColumns]:
        """The commit after ``add_provisional`` answered: its rows count, except those of the
        partitions whose acknowledgements it did not record; none count when it failed (None).
        The rows that count."""
        data = _entry(DROP, token, None) if unrecorded is None else _entry(CONFIRM, token, tuple(unrecorded))
        with self._lock:
            blocks, _ = self._provisional.pop(token, (None, b""))
            if blocks is None:
                return []
            self._file.write(data)
            if unrecorded is None:
                return []
            counted = _recorded(blocks, unrecorded)
            self._blocks += counted
            return counted

    def holds(self) -> bool:
        """Whether settled rows wait to be taken."""
        return bool(self._blocks)

    def begin(self, task: Task) -> None:
        """A task of a micro-batch starts in this process: the rows handed to the last one are
        Spark's (it ended, or Spark would not start another here) and leave the file, unless
        ``task`` is that same task run again, whose rows are handed again."""
        with self._lock:
            self._task = task
            if self._handed_to is None:
                return
            again = self._handed if self._handed_to == task else []
            with self.path.open("rb") as handle:
                handle.seek(self._after_mark)
                tail = handle.read()  # what was written after the mark: every write is under the lock
            head = _entry(ROWS, 0, again) if again else b""
            self._rewrite(head + b"".join(self._open_at_mark) + tail)
            self._blocks = again + self._blocks
            self._handed, self._handed_to, self._open_at_mark = [], None, []
        if again:
            log.warning("task %s is run again in this process: handing its %d outcome block(s) again", task, len(again))

    def take(self) -> list[OutcomeColumns]:
        """Every settled row not yet taken, this process's and dead processes' of the same queue,
        handed to the task ``begin`` started: marked so in the file, where they stay until the
        next task starts.

        A process driven by hand, with no task begun (a test, a tool), takes the rows for good:
        its file keeps only the provisional ones.
        """
        self.adopt(thorough=True)
        with self._lock:
            blocks, self._blocks = self._blocks, []
            if self._task is None or (not blocks and self._handed_to is None):
                # Nothing handed is pending: the file needs only the provisional rows.
                kept = [data for _, data in self._provisional.values()]
                if blocks or kept or self._file.tell():
                    self._rewrite(b"".join(kept))
                return blocks
            if not blocks:
                return []
            self._file.write(_entry(TAKEN, 0, self._task))
            self._handed += blocks
            self._handed_to = self._task
            self._after_mark = self._file.tell()
            self._open_at_mark = [data for _, data in self._provisional.values()]
        return blocks

    def _rewrite(self, data: bytes) -> None:
        """This process's file written anew (under ``_lock``), renamed into place: a process that dies
        at any point leaves the whole of the old file or of the new one."""
        if data:
            replace_whole(self.path, data)
        else:
            self._file.truncate(0)
            return
        with contextlib.suppress(OSError):
            self._file.close()
        self._file = self.path.open("ab", buffering=0)

    def adopt(self, thorough: bool = False) -> None:
        """Take over the files of this queue's processes on this machine that died: their settled
        rows and their provisional ones never settled join this process's rows (in memory and in
        its file), and the records of the latter are registered in ``counted.json`` first. Rows
        they had handed to a task join them if that task is being run again, are dropped if it
        ended, and wait in ``handed.jsonl`` if that is not known yet (``_fate``).

        Under the folder's lock from the claim to the registration and the rewriting of
        ``handed.jsonl``, so a process that looks a record up (``redelivered_counted``) after this
        started sees it registered, and two processes never take the same rows out of
        ``handed.jsonl``. A fetcher looks without the lock first and goes on when nothing is left;
        a take (``thorough``) looks under it, so that it sees a file another process is claiming
        at that moment once its rows are in ``handed.jsonl``: the retry of a task must not miss
        the rows its failed attempt had taken.
        """
        task = self._task
        if not thorough:
            stamp = file_stamp(self.folder / HANDED)
            handed_due = stamp is not None and (stamp, task) != self._handed_seen
            if not handed_due and not self._left_by_the_dead():
                return
        blocks: list[OutcomeColumns] = []
        unsettled: list[OutcomeColumns] = []
        again: list[OutcomeColumns] = []
        claimed_paths: list[Path] = []
        read: list[OutcomeColumns] = []  # every row of the claimed files: their ended records are registered
        me = self.path.name.removesuffix(SUFFIX)
        with folder_lock(self.folder):
            dead = self._left_by_the_dead()
            waiting: dict[Task, list[OutcomeColumns]] = {}
            joined = False  # whether a dead process's file had rows handed to a task
            for path in dead:
                claimed = path.with_name(f"{path.name.partition(SUFFIX)[0]}{SUFFIX}.{me}")
                try:
                    path.rename(claimed)  # one process takes it over, whichever renames first
                except FileNotFoundError:
                    continue
                claimed_paths.append(claimed)
                settled, provisional, handed_on = _read(claimed)
                blocks += settled
                unsettled += provisional
                read += settled + provisional
                for handed_to, rows in handed_on.items():
                    waiting.setdefault(handed_to, []).extend(rows)
                    read += rows
                    joined = True
            store = self.folder / HANDED
            stored = _read(store)[2] if file_stamp(store) is not None else {}
            for handed_to, rows in stored.items():
                waiting.setdefault(handed_to, []).extend(rows)
            unknown: dict[Task, list[OutcomeColumns]] = {}
            received: list[Task] = []
            for handed_to, rows in waiting.items():
                fate = _fate(handed_to, task)
                if fate == LOST:
                    again += rows
                elif fate == UNKNOWN:
                    unknown[handed_to] = rows
                else:
                    received.append(handed_to)
            if read:  # a settled row's acknowledgement may still have been on its way (module docstring)
                self._register(read)
            handed = blocks + unsettled + again
            if handed:  # in this process's file before they leave handed.jsonl: never in neither
                data = _entry(ROWS, 0, handed)
                with self._lock:
                    self._blocks += handed
                    self._file.write(data)
            if not unknown:
                if stored:
                    store.unlink(missing_ok=True)
            elif joined or unknown.keys() != stored.keys():  # written anew only when it changed
                replace_whole(store, b"".join(_entry(ROWS, 0, r) + _entry(TAKEN, 0, t) for t, r in unknown.items()))
            self._handed_seen = (file_stamp(store), task)
        if handed:
            log.warning(
                "handing on %d outcome block(s) settled by a worker process that died (%d of them "
                "whose commit had not answered, %d handed to a task that is being run again)",
                len(handed),
                len(unsettled),
                len(again),
            )
        if received or unknown:
            log.info(
                "outcome rows a worker process that died had handed to tasks: those of %s ended (Spark has "
                "them), those of %s wait for a retry of their task or the next batch (this task: %s)",
                received,
                list(unknown),
                task,
            )
        for claimed in claimed_paths:
            claimed.unlink(missing_ok=True)

    def _left_by_the_dead(self) -> list[Path]:
        """The files whose rows no living process holds: dead processes' own files, and files a
        process that died since had claimed from another (``<owner>.outbox.<claimer>``) and not
        handed on yet.

        A dead process's ``.partial`` file is removed instead: it was never renamed into place,
        so the file it was to replace still holds every row.
        """
        found = []
        for path in self.folder.glob(f"*{SUFFIX}*"):
            owner, _, holder = path.name.partition(SUFFIX)
            if path == self.path or not owner:
                continue
            if holder == PARTIAL_SUFFIX:
                if not tag_alive(owner):
                    path.unlink(missing_ok=True)
            elif not tag_alive(holder.removeprefix(".") or owner):
                found.append(path)
        return found

    def redelivered_counted(self, records: list[tuple[int, int, int]]) -> set[int]:
        """Which of ``records`` (partition, offset, delivery count) were handed on as counted at a
        lower delivery count (``adopt``): their indices.

        An entry stays until it expires, not until it is found: the acknowledgement of the
        delivery that found it may fail to land too, and the next delivery must still find it.
        Under the folder's lock, so an adoption under way in another process is seen once it is
        whole; only a poll with a record delivered again looks (the crash journal's ``collect``
        does as much). A look at ``counted.json``'s stamp when nothing changed, a read when it did.
        """
        with folder_lock(self.folder):
            stamp = file_stamp(self.folder / COUNTED)
            if stamp != self._counted_seen:
                self._counted = _read_counted(self.folder) if stamp is not None else {}
                self._counted_seen = stamp
        counted = self._counted
        return {
            i
            for i, (partition, offset, delivery) in enumerate(records)
            if (entry := counted.get((partition, offset))) is not None and entry.delivery < delivery
        }

    def dead_lettered(self, partition: int, offset: int) -> bool:
        """Whether a record ``redelivered_counted`` found was dead-lettered (else it was accepted)."""
        entry = self._counted.get((partition, offset))
        return entry is not None and entry.dead

    def _register(self, blocks: list[OutcomeColumns]) -> None:
        """The accepted and dead-lettered records of ``blocks`` in ``counted.json`` (under the
        folder's lock). A released record is not: its redelivery is handled as any other."""
        ended = [
            (int(partition), int(offset), int(delivery), outcome == DEAD_LETTERED)
            for block in blocks
            for partition, offset, delivery, outcome in each_record(block)  # a row may stand for a run of records
            if outcome in (ACCEPTED, DEAD_LETTERED)
        ]
        if not ended:
            return
        counted = _read_counted(self.folder)
        now_ms = int(time.time() * 1000)
        for partition, offset, delivery, dead in ended:
            counted[(partition, offset)] = Counted(delivery, now_ms, dead)
        _write_counted(self.folder, counted)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        if not self._blocks and not self._provisional and self._handed_to is None:
            self.path.unlink(missing_ok=True)


def _entry(kind: int, token: int, payload: Any) -> bytes:
    """One entry of a process's file, one line of JSON: one write each, and a reader stops at a cut one
    (a line without its end). Data, parsed and checked when read: nothing in the file is run."""
    if kind in (ROWS, PROVISIONAL):
        payload = [[_packed(column) for column in block] for block in payload]
    return json.dumps([kind, token, payload], separators=(",", ":")).encode() + b"\n"


def _packed(column: list[Any]) -> list[Any] | dict[str, Any]:
    """A column as written: ``{"all": value, "rows": n}`` when every row holds the same value (the
    topic, the outcome, no error, a poll's latency), the list otherwise. Half the time of writing
    such columns out in full, which put JSON behind pickle on the fetcher's path."""
    rows = len(column)
    if rows > 1 and column.count(column[0]) == rows:
        return {"all": column[0], "rows": rows}
    return column


def _recorded(blocks: list[OutcomeColumns], unrecorded: Collection[tuple[str, int]]) -> list[OutcomeColumns]:
    """The rows of ``blocks`` outside the ``unrecorded`` partitions (all of them, the common case)."""
    if not unrecorded:
        return blocks
    gone = set(unrecorded)
    kept: list[OutcomeColumns] = []
    for block in blocks:
        rows = [
            i
            for i, place in enumerate(zip(block[TOPIC_COLUMN], block[PARTITION_COLUMN], strict=True))
            if place not in gone
        ]
        if len(rows) == len(block[TOPIC_COLUMN]):
            kept.append(block)
        elif rows:
            kept.append(tuple([column[i] for i in rows] for column in block))
    return kept


def _read(path: Path) -> tuple[list[OutcomeColumns], list[OutcomeColumns], dict[Task, list[OutcomeColumns]]]:
    """A dead process's file: its settled blocks not handed to a task, its provisional ones never
    settled, and those it handed to each task (``handed.jsonl`` is read the same way).

    Every whole entry counts; one it was writing when it died is cut short (no line end), and
    the reading stops there. So it does at an entry that is not what this module writes (a file
    from an older worker, a damaged one): what follows it is not trusted either.
    """
    blocks: list[OutcomeColumns] = []
    provisional: dict[int, list[OutcomeColumns]] = {}
    handed: dict[Task, list[OutcomeColumns]] = {}
    lines = path.read_bytes().split(b"\n")
    for line in lines[:-1]:  # the last one has no end: empty, or cut short
        try:
            kind, token, payload = _parsed(line)
        except (ValueError, TypeError, RecursionError):
            log.warning("%s: an entry this worker does not write; the rest of the file is left out", path)
            break
        if kind == ROWS:
            blocks += payload
        elif kind == PROVISIONAL:
            provisional[token] = payload
        elif kind == CONFIRM:
            blocks += _recorded(provisional.pop(token, []), payload)
        elif kind == DROP:
            provisional.pop(token, None)
        elif kind == TAKEN:
            handed.setdefault(payload, []).extend(blocks)
            blocks = []
    return blocks, [block for kept in provisional.values() for block in kept], handed


def _parsed(line: bytes) -> tuple[int, int, Any]:
    """One entry as ``_entry`` wrote it, its payload checked for its kind; ValueError or TypeError if it is not."""
    kind, token, payload = json.loads(line)
    if type(kind) is not int or type(token) is not int:
        raise ValueError("kind and token are integers")
    if kind in (ROWS, PROVISIONAL):
        return kind, token, [_block(block) for block in payload]
    if kind == CONFIRM:
        return kind, token, {(_text(topic), _integer(partition)) for topic, partition in payload}
    if kind == DROP and payload is None:
        return kind, token, None
    if kind == TAKEN and type(payload) is list and len(payload) == 3:
        stream, batch, slot = payload
        return kind, token, (_text(stream), _integer(batch), _integer(slot))
    raise ValueError(f"no entry of kind {kind!r} with such a payload")


def _block(columns: Any) -> OutcomeColumns:
    """A block of outcome columns as read: one list per OUTCOME_ARROW column, all as long, each
    value of its column's type, and each row's records the span of its offsets."""
    if type(columns) is not list or len(columns) != len(OUTCOME_ARROW):
        raise ValueError("a block has one list per outcome column")
    unpacked = [_unpacked(values, _CHECKS[column.type]) for values, column in zip(columns, OUTCOME_ARROW, strict=True)]
    if len({len(values) for values in unpacked}) != 1:
        raise ValueError("a block's columns are all as long")
    spans = zip(unpacked[OFFSET_COLUMN], unpacked[LAST_OFFSET_COLUMN], unpacked[RECORDS_COLUMN], strict=True)
    if not all(type(n) is int and n >= 1 and type(first) is int and last == first + n - 1 for first, last, n in spans):
        raise ValueError("a row's records are the span of its offsets")
    return tuple(unpacked)


def _unpacked(values: Any, check: Callable[[Any], None]) -> list[Any]:
    """A column as ``_packed`` wrote it, each value checked."""
    if type(values) is dict:
        if values.keys() != {"all", "rows"} or type(values["rows"]) is not int or values["rows"] < 0:
            raise ValueError("a packed column is {all, rows}")
        check(values["all"])
        return [values["all"]] * values["rows"]
    if type(values) is not list:
        raise ValueError("a column is a list")
    for value in values:
        check(value)
    return values


def _text(value: Any) -> str:
    if type(value) is not str:
        raise TypeError("text expected")
    return value


def _integer(value: Any) -> int:
    if type(value) is not int:
        raise TypeError("an integer expected")
    return value


def _optional_text(value: Any) -> None:
    if value is not None and type(value) is not str:
        raise TypeError("text or null expected")


def _optional_integer(value: Any) -> None:
    if value is not None and type(value) is not int:
        raise TypeError("an integer or null expected")


def _optional_number(value: Any) -> None:
    if value is not None and type(value) is not float and type(value) is not int:
        raise TypeError("a number or null expected")


def _optional_counts(value: Any) -> None:
    """A run's latency bucket counts (outcomes.py), or null on a one-record row."""
    if value is not None and (
        type(value) is not list or len(value) != LATENCY_SLOTS or any(type(n) is not int for n in value)
    ):
        raise TypeError(f"{LATENCY_SLOTS} integers or null expected")


_CHECKS = {
    pa.string(): _optional_text,
    pa.int32(): _optional_integer,
    pa.int64(): _optional_integer,
    pa.float64(): _optional_number,
    pa.list_(pa.int32()): _optional_counts,
}


class Counted(NamedTuple):
    """A record ``counted.json`` holds: the delivery its row was of, when it was registered (ms),
    and whether it was dead-lettered (else accepted)."""

    delivery: int
    registered_ms: int
    dead: bool = False


def _read_counted(folder: Path) -> dict[tuple[int, int], Counted]:
    """``counted.json``: (partition, offset) → what was counted, the expired left out."""
    try:
        kept = json.loads((folder / COUNTED).read_text())
        counted = {(int(p), int(o)): Counted(int(d), int(ms), bool(rest and rest[0])) for p, o, d, ms, *rest in kept}
    except (OSError, ValueError, TypeError):
        return {}
    oldest_ms = (time.time() - DELIVERY_MEMORY_S) * 1000
    return {key: entry for key, entry in counted.items() if entry.registered_ms >= oldest_ms}


def _write_counted(folder: Path, counted: dict[tuple[int, int], Counted]) -> None:
    """Written anew and renamed into place (under the folder's lock); a dead-lettered record's row
    has a fifth field."""
    rows = [[p, o, e.delivery, e.registered_ms, *([1] if e.dead else [])] for (p, o), e in sorted(counted.items())]
    replace_whole(folder / COUNTED, json.dumps(rows).encode())
