"""Which records a Python worker process was handling when it died, told to the processes after it.

A handler that kills its process (``os._exit``, a crash in native code, the kernel's OOM
killer) leaves no exception to catch: the task fails, Spark starts another Python worker and
tries the task again, and the same record kills that one too, until the query fails. To end
such a record in the DLQ after ``deliveryLimit`` deliveries like any other failing one, each
process keeps the records its handler calls are in, one slot per thread, in a file mapped into
memory (a write of a few bytes a call, no system call). A process that starts (or starts a
task) looks for the files of processes that are gone: each record still in one of their slots
was in a call when its process died, and counts one crash, kept in ``crashes.json``.

A record with crashes is a suspect: its next call runs alone (the other calls end first, and
none starts until it returns), so if the process dies again only that record is blamed, and a
record that was only running beside the culprit is cleared once its call returns. Crashes
count as deliveries: a record with ``deliveryLimit`` of them goes to the DLQ (``WorkerDied``)
without another call.

The folder is per queue and per machine (an executor pod's own disk on Kubernetes), and private
to the user the worker runs as (queueplane.run.executor.private_dirs): made 0700 and checked on every
open, so no other user of the machine can plant calls or crashes in it. A task retried on
another executor starts its count there again, so a record can kill at most ``deliveryLimit``
processes per executor. Spark gives each task ``deliveryLimit + 1`` attempts
(queueplane.run.spark.session), so the retry that dead-letters it comes before the query fails.

A kmq call also leaves the delivery it belongs to (the copy's place and when its start
marker was written). Once that delivery's lock has run out, the tracker has timed it out and
redelivered or dead-lettered it; a retried task that comes after that leaves the copy to the
tracker, or the message would end twice (``crashed_deliveries``).

A process that ends itself on purpose (the memory guard, queueplane.run.executor.memory_guard) says
why first, in a file beside its slots (``ending``); the records it blames carry that reason to
the DLQ instead of ``WorkerDied``. One that ends because a Kafka client call never returned
(queueplane.run.executor.call_guard) removes its slots first (``disown``): none of its records is blamed.

Consumer-group and kmq tasks run a suspect alone in their process. A share process cannot:
every record it has acquired comes back a delivery later when it dies, in a call or not, so
its suspects run in a child process each (queueplane.run.share.executor.isolated) and only the child dies.
A share record whose last allowed delivery was lost that way comes once more, on a reserve
delivery, with no call left: the journal keeps which records a process died with as its only
call (``died_alone``), so that one is dead-lettered as ``WorkerDied`` and one that only died
beside others' calls is not blamed for a death that may be another record's.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeVar

from queueplane.run.dead_letters import Failure
from queueplane.run.executor.private_dirs import private_dir, queue_folder

# In use (CALL, SUSPECT or 0), partition, offset, when the call started (ms); then the delivery
# the call belongs to: the copy's partition and offset, and when it began (ms; 0 when not known).
SLOT = struct.Struct("<qqqqqqq")
_PLACE = struct.Struct("<qqq")  # a slot's first fields: in use, partition, offset
_TIMED = struct.Struct("<qqqq")  # and when the call started
_USED = struct.Struct("<q")  # in use alone: 0 frees the slot, whatever the rest still says
CALL, SUSPECT = 1, 2
SLOTS = 4096  # threads a process may run calls on (pool threads, and replacements of stuck ones)
SUFFIX = ".calls"
REASON_SUFFIX = ".reason"  # beside a process's calls: why it ended itself, when it did
CRASHES = "crashes.json"
ALONE_POLL_S = 0.005
WORKER_DIED = "WorkerDied"
DEAD = 1 << 30  # the count of a record dead-lettered for its crashes
# How long a crashed delivery is remembered: far past any lockDuration, after which it is the tracker's anyway.
DELIVERY_MEMORY_S = 3600.0
T = TypeVar("T")
R = TypeVar("R")


# A thread's own slot: enter(partition, offset) before a call (False: use ``call``), leave() after.
PlainCalls = tuple[Callable[[int, int], bool], Callable[[], None]]


class Delivery(NamedTuple):
    """The delivery a call belongs to: where its copy is, and when the delivery began (ms)."""

    partition: int
    offset: int
    began_ms: int


NO_DELIVERY = Delivery(-1, -1, 0)
EMPTY = (0, 0, 0, 0, *NO_DELIVERY)  # a free slot


@dataclass
class Kept:
    """What ``crashes.json`` holds for the queue's processes on this machine."""

    crashes: dict[tuple[int, int], int] = field(default_factory=dict)  # deaths per record
    # (copy partition, copy offset) → when the delivery a process died in began (ms)
    deliveries: dict[tuple[int, int], int] = field(default_factory=dict)
    # Why the last process that died with the record in a call ended, when it said so.
    reasons: dict[tuple[int, int], Failure] = field(default_factory=dict)
    # Records a process died with as its only call (a share suspect's child, or a process that
    # ran one call): that death is theirs. One that only died beside others' calls may be innocent.
    died_alone: set[tuple[int, int]] = field(default_factory=set)
    # Records dead-lettered for their crashes → the copy (partition, offset) that went to the DLQ:
    # a retry of its task meets that copy again and must end it the same way (its row died with
    # the process); any other copy of the record is a duplicate.
    dead_at: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


def worker_died(crashes: int, reason: Failure | None = None) -> Failure:
    """The DLQ's error for a record that killed ``crashes`` processes; ``reason`` when the last
    one said why it ended (the memory guard), otherwise the usual suspects are named."""
    died = f"the handler's process died {crashes} time(s) while handling this record"
    if reason is not None:
        return Failure(reason.error_class, f"{reason.message}; {died}")
    return Failure(WORKER_DIED, f"{died} (os._exit, a crash in native code, the OOM killer, or its pod killed)")


def journal_folder(group_id: str) -> Path:
    """Where a queue's processes on this machine keep their calls: a folder private to this user
    (QUEUEPLANE_CALLS_DIR to move its root; queueplane.run.executor.private_dirs), or PrivateDirRefused."""
    return queue_folder(group_id)


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), which tells a pid reused by another process
    apart; None once it has died, even while its parent has not reaped it yet (a zombie, which
    Spark's daemon may leave for a while: counted alive, its calls were never blamed and the
    record that killed it ran again and again)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


class CrashJournal:
    """One per Python worker process and queue: its calls' slots, and the crashes of processes before it."""

    def __init__(self, folder: Path, alone_s: float):
        """``alone_s``: the longest a suspect holds the others back, and waits for them (lockDuration):
        a call that hangs is given up by then, and must not stop the process's other calls."""
        self.folder = folder
        self.alone_s = alone_s
        private_dir(folder)  # made 0700, or refused when another user could have written in it
        self.path = folder / f"{process_tag()}{SUFFIX}"
        with self.path.open("wb") as handle:
            handle.truncate(SLOT.size * SLOTS)
        with self.path.open("r+b") as handle:
            self._map = mmap.mmap(handle.fileno(), SLOT.size * SLOTS)
        self._next_slot = itertools.count()
        self._pack = SLOT.pack_into
        self._local = threading.local()
        self._hold(Kept())
        self._alone = threading.Condition(threading.Lock())
        self._alone_slot: int | None = None  # the slot of the suspect running alone
        self._alone_until = 0.0  # when the others go on regardless (monotonic)
        self._seen: tuple[int, int, int] | None = None  # crashes.json as last read
        self.collect()

    # -- what processes before this one left ------------------------------------------------
    def collect(self) -> None:
        """Count the calls of processes that died in them, and read every crash counted so far.

        Nothing to do is the common case, and costs a look at the folder and a stat: a share
        fetcher asks before every poll that holds records delivered again.
        """
        if self._seen is not None and self._seen == file_stamp(self.folder / CRASHES) and not self._dead():
            return
        with folder_lock(self.folder):
            kept = self._read()
            dead = self._dead()
            for path in dead:
                reason = _reason(_reason_path(path))
                blamed = list(_blamed(path.read_bytes(), self.alone_s))
                for key, delivery in blamed:
                    if kept.crashes.get(key, 0) < DEAD:
                        kept.crashes[key] = kept.crashes.get(key, 0) + 1
                    if reason is not None:
                        kept.reasons[key] = reason
                    else:
                        kept.reasons.pop(key, None)
                    if delivery.began_ms:
                        kept.deliveries[(delivery.partition, delivery.offset)] = delivery.began_ms
                if len(blamed) == 1:
                    kept.died_alone.add(blamed[0][0])
            if dead:
                self._write(kept)  # first, then the files: no death goes uncounted
                for path in dead:
                    path.unlink(missing_ok=True)
                    _reason_path(path).unlink(missing_ok=True)
            self._seen = file_stamp(self.folder / CRASHES)
        self._hold(kept)

    def ending(self, reason: Failure) -> None:
        """This process is about to end itself (the memory guard): say why, for the records in its calls."""
        partial = _reason_path(self.path).with_suffix(".partial")
        partial.write_text(json.dumps([reason.error_class, reason.message]))
        partial.replace(_reason_path(self.path))

    def disown(self) -> None:
        """This process is about to end for a cause none of its calls had (a Kafka client call that
        never returned, queueplane.run.executor.call_guard): the processes after it blame none of them."""
        self.path.unlink(missing_ok=True)

    def crashed(self, partition: int, offset: int, reason: Failure | None) -> int:
        """The record's call killed a process this process watched (a share suspect's own child):
        one more crash, with the reason the child gave; the count."""
        key = (partition, offset)
        with folder_lock(self.folder):
            kept = self._read()
            kept.crashes[key] = count = min(kept.crashes.get(key, 0), DEAD - 1) + 1
            if reason is None:
                kept.reasons.pop(key, None)
            else:
                kept.reasons[key] = reason
            kept.died_alone.add(key)
            self._write(kept)
        self._hold(kept)
        return count

    def cleared(self, partition: int, offset: int) -> None:
        """The record's call returned: it is no suspect any more."""
        self._set(partition, offset, None)

    def dead_lettered(self, partition: int, offset: int, copy: tuple[int, int]) -> None:
        """The record went to the DLQ for its crashes, as ``copy`` (where that copy was read): a
        copy of it that comes later (kmq) is not called."""
        self._set(partition, offset, DEAD, copy)

    def _set(self, partition: int, offset: int, count: int | None, dead_at: tuple[int, int] | None = None) -> None:
        key = (partition, offset)
        if key not in self.crashes and count is None:
            return
        with folder_lock(self.folder):
            kept = self._read()
            if count is None:
                kept.crashes.pop(key, None)
                kept.reasons.pop(key, None)
                kept.died_alone.discard(key)
                kept.dead_at.pop(key, None)
            else:
                kept.crashes[key] = count
                if dead_at is not None:
                    kept.dead_at[key] = dead_at
            self._write(kept)
        if count is None:
            self.crashes.pop(key, None)
            self.reasons.pop(key, None)
            self.died_alone.discard(key)
            self.dead_at.pop(key, None)
        else:
            self.crashes[key] = count
            if dead_at is not None:
                self.dead_at[key] = dead_at

    # -- this process's calls -----------------------------------------------------------------
    def begin(self, partition: int, offset: int, delivery: Delivery = NO_DELIVERY) -> int:
        """Before a handler call: its record in this thread's slot (alone if it is a suspect); a token for ``end``.

        While there is no suspect this is a slot lookup and one write into the mapped file, no
        lock: it runs on every record of the hot path.
        """
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = next(self._next_slot) % SLOTS
        at = slot * SLOT.size
        if self.crashes and (partition, offset) in self.crashes:
            self._enter_alone(slot)
            self._pack(self._map, at, SUSPECT, partition, offset, int(time.time() * 1000), *delivery)
            return -1 - slot
        # In the slot first, then look: a suspect about to run alone either sees this call and
        # waits for it, or this call sees the suspect and steps back until it is done.
        self._pack(self._map, at, CALL, partition, offset, int(time.time() * 1000), *delivery)
        if self._alone_slot is not None:
            self._step_back(at, partition, offset, delivery)
        return slot

    def end(self, token: int) -> None:
        """After the call returned (or raised): the slot is free, and a suspect lets the others go on."""
        if token >= 0:
            self._pack(self._map, token * SLOT.size, *EMPTY)
            return
        slot = -1 - token
        self._pack(self._map, slot * SLOT.size, *EMPTY)
        with self._alone:
            if self._alone_slot == slot:
                self._alone_slot = None
            self._alone.notify_all()

    def thread_calls(self) -> tuple[Callable[[int, int], None], int]:
        """For a thread that runs calls one after another (a share pool thread): a function that
        puts the record it is about to call in the thread's slot, and the slot.

        It writes the record's place alone, no start time (about 0.2 µs a call where the full
        slot cost 0.6): a call that hangs past its deadline is taken out of the slot by
        ``give_up`` instead of being told apart by its age. ``idle`` empties the slot when the
        thread has no call.
        """
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = next(self._next_slot) % SLOTS
        self._pack(self._map, slot * SLOT.size, *EMPTY)
        at, pack, buffer = slot * SLOT.size, _PLACE.pack_into, self._map

        def calling(partition: int, offset: int) -> None:
            pack(buffer, at, CALL, partition, offset)

        return calling, slot

    def plain_calls(self) -> PlainCalls:
        """For a thread whose calls are mostly of records no process died with: ``enter(partition,
        offset)`` puts the record in this thread's slot with its start time, as ``begin`` does,
        and ``leave()`` empties the slot, as ``end`` does, without ``begin``'s lookups a call.

        ``enter`` is False, the slot empty, when the record must go through ``call`` instead: it
        is a suspect, or a suspect runs alone in this process now.
        """
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = next(self._next_slot) % SLOTS
        at, buffer, clock = slot * SLOT.size, self._map, time.time
        self._pack(buffer, at, *EMPTY)  # its delivery fields stay NO_DELIVERY: enter writes the first four
        timed, used = _TIMED.pack_into, _USED.pack_into

        def enter(partition: int, offset: int) -> bool:
            if self.crashes and (partition, offset) in self.crashes:
                return False
            timed(buffer, at, CALL, partition, offset, int(clock() * 1000))
            if self._alone_slot is not None:
                used(buffer, at, 0)
                return False
            return True

        def leave() -> None:
            used(buffer, at, 0)

        return enter, leave

    def idle(self) -> None:
        """This thread is in no call (after ``thread_calls``)."""
        slot = getattr(self._local, "slot", None)
        if slot is not None:
            self._pack(self._map, slot * SLOT.size, *EMPTY)

    def give_up(self, slot: int) -> None:
        """The call in ``slot`` hangs past its deadline and was given up (a Timeout): if the process
        dies, it is not blamed, and its record's next delivery runs as any other."""
        self._pack(self._map, slot * SLOT.size, *EMPTY)

    def call(
        self,
        partition: int,
        offset: int,
        handler: Callable[[T], R],
        record: T,
        on_start: Callable[[], None] | None = None,
        delivery: Delivery = NO_DELIVERY,
    ) -> R:
        """``handler(record)`` between ``begin`` and ``end``; a suspect whose call returns (or raises) is cleared.

        ``on_start`` runs once the call may start: a suspect waits in ``begin`` for the others
        (up to ``alone_s``), a wait that is not its handler's time and must not count against
        its deadline.
        """
        token = self.begin(partition, offset, delivery)
        if on_start is not None:
            on_start()
        try:
            return handler(record)
        finally:
            self.end(token)
            if token < 0:
                self.cleared(partition, offset)  # it came back: it did not kill its process

    def _step_back(self, at: int, partition: int, offset: int, delivery: Delivery) -> None:
        while self._alone_slot is not None and time.monotonic() < self._alone_until:
            self._pack(self._map, at, *EMPTY)
            with self._alone:
                self._alone.wait_for(self._not_alone, max(0.0, self._alone_until - time.monotonic()))
            self._pack(self._map, at, CALL, partition, offset, int(time.time() * 1000), *delivery)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._map.close()
        self.path.unlink(missing_ok=True)

    def _not_alone(self) -> bool:
        return self._alone_slot is None or time.monotonic() >= self._alone_until

    def _enter_alone(self, slot: int) -> None:
        """Become the only call: no new call starts from here on, and the running ones end first
        (each wait bounded by ``alone_s``).

        A suspect behind another waits for that one's whole turn, its wait for the others and
        then its call, not for a bound of its own: two suspects that both waited ``alone_s`` for
        the same hanging call would otherwise start together, and a death in one would blame
        the other (and drop the reason the first gave, its memory guard's).
        """
        with self._alone:
            while not self._not_alone():
                self._alone.wait(max(0.0, self._alone_until - time.monotonic()))
            self._alone_slot = slot
            self._alone_until = time.monotonic() + 2 * self.alone_s  # the wait for the others, then its call
        others_until = time.monotonic() + self.alone_s
        while time.monotonic() < others_until and any(
            i != slot for i in _running_slot_indices(self._map, self.alone_s)
        ):
            time.sleep(ALONE_POLL_S)
        with self._alone:  # its call starts: past its deadline it is given up, and the others go on
            self._alone_until = time.monotonic() + self.alone_s
            self._alone.notify_all()

    # -- files ----------------------------------------------------------------------------------
    def _hold(self, kept: Kept) -> None:
        """What this process last read of ``crashes.json``, as the attributes its callers read."""
        self.crashes = kept.crashes
        self.crashed_deliveries = kept.deliveries
        self.reasons = kept.reasons
        self.died_alone = kept.died_alone
        self.dead_at = kept.dead_at

    def _read(self) -> Kept:
        """What ``crashes.json`` holds, its deliveries remembered DELIVERY_MEMORY_S."""
        try:
            raw = json.loads((self.folder / CRASHES).read_text())
            kept = Kept(
                crashes={(int(p), int(o)): int(n) for p, o, n in raw["crashes"]},
                deliveries={(int(p), int(o)): int(ms) for p, o, ms in raw["deliveries"]},
                reasons={(int(p), int(o)): Failure(str(c), str(m)) for p, o, c, m in raw.get("reasons", [])},
                died_alone={(int(p), int(o)) for p, o in raw.get("died_alone", [])},
                dead_at={(int(p), int(o)): (int(cp), int(co)) for p, o, cp, co in raw.get("dead_at", [])},
            )
        except (OSError, ValueError, KeyError, TypeError):
            return Kept()
        oldest_ms = (time.time() - DELIVERY_MEMORY_S) * 1000
        kept.deliveries = {key: ms for key, ms in kept.deliveries.items() if ms >= oldest_ms}
        return kept

    def _write(self, kept: Kept) -> None:
        raw = {
            "crashes": [[p, o, n] for (p, o), n in sorted(kept.crashes.items())],
            "deliveries": [[p, o, ms] for (p, o), ms in sorted(kept.deliveries.items())],
            "reasons": [[p, o, r.error_class, r.message] for (p, o), r in sorted(kept.reasons.items())],
            "died_alone": [[p, o] for p, o in sorted(kept.died_alone)],
            "dead_at": [[p, o, cp, co] for (p, o), (cp, co) in sorted(kept.dead_at.items())],
        }
        replace_whole(self.folder / CRASHES, json.dumps(raw).encode())

    def _dead(self) -> list[Path]:
        """The call files of this queue's processes on this machine that are gone."""
        return dead_process_files(self.folder, SUFFIX, self.path)


def process_tag() -> str:
    """``<pid>-<start time>`` of this process: names its files in a journal folder; unlike a pid,
    never reused."""
    pid = os.getpid()
    return f"{pid}-{_start_time(pid)}"


def tag_alive(tag: str) -> bool:
    """Whether the process ``process_tag`` named is still running."""
    pid, _, started = tag.partition("-")
    return pid.isdigit() and _start_time(int(pid)) == started


def dead_process_files(folder: Path, suffix: str, own: Path) -> list[Path]:
    """The files ``<process_tag><suffix>`` in ``folder`` of processes that are gone (not ``own``)."""
    return [p for p in folder.glob(f"*{suffix}") if p != own and not tag_alive(p.name.removesuffix(suffix))]


PARTIAL_SUFFIX = ".partial"  # a file being written anew (replace_whole)


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """The lock of a queue's folder on this machine, across its processes: every shared file in it
    (``crashes.json``, the share outbox's ``counted.json``) is read and written anew under it."""
    with (folder / "lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def replace_whole(path: Path, data: bytes) -> None:
    """A file of the folder written anew beside it (``<name>.partial``) and renamed into place, so
    a reader never sees it cut short.

    One writer at a time (a shared file only under ``folder_lock``, a process's own file by that
    process), so one partial name per file serves every writer: a process killed between the
    write and the rename leaves a partial the next writer overwrites, never one per process that
    nothing removes.
    """
    partial = path.with_name(f"{path.name}{PARTIAL_SUFFIX}")
    partial.write_bytes(data)
    partial.replace(path)


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """Tells one version of a file from the next: each is written anew and renamed into place."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


def _reason_path(calls: Path) -> Path:
    return calls.with_name(calls.name + REASON_SUFFIX)


def _reason(path: Path) -> Failure | None:
    """What a dead process said of its end, if it said anything."""
    try:
        error_class, message = json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return None
    return Failure(str(error_class), str(message))


def _running_slot_indices(buffer: bytes | mmap.mmap, given_up_s: float) -> Iterator[int]:
    """The slots of calls that may still return: one started ``given_up_s`` ago was given up
    (it hangs, its thread is kept), and waiting for it would only hold the suspect back."""
    oldest_ms = int((time.time() - given_up_s) * 1000)
    for i, (used, _partition, _offset, started, *_delivery) in enumerate(SLOT.iter_unpack(buffer)):
        if used and started > oldest_ms:
            yield i


def _blamed(buffer: bytes, given_up_s: float) -> Iterator[tuple[tuple[int, int], Delivery]]:
    """The records of a dead process's calls that may have killed it, with their deliveries.

    A call that had run past its deadline was given up and counted (a Timeout) before the
    process died: it hangs, it did not crash. The process died after its newest call started,
    so a call started ``given_up_s`` before that one is such a call. (Share pool threads note no
    start time, and empty a given-up call's slot instead: all their calls are blamed.)
    """
    calls = [
        (partition, offset, started, Delivery(*delivery))
        for used, partition, offset, started, *delivery in SLOT.iter_unpack(buffer)
        if used
    ]
    newest = max((started for _, _, started, _ in calls), default=0)
    for partition, offset, started, delivery in calls:
        if newest - started < given_up_s * 1000:
            yield (partition, offset), delivery
