"""A Python worker process that ends itself at its memory limit, saying why, before it takes the machine's.

A handler that allocates without end is not stopped by anything in Spark: on Kubernetes the
kernel's OOM killer ends the executor's container (every task on it, the JVM included), and in
local mode it may pick any process of the machine, the broker among them. Spark's own Python
limit (``spark.executor.pyspark.memory``) caps address space, not memory: a worker with a
hundred threads and librdkafka reserves gigabytes it never touches. So a thread reads the
process's resident size every ``INTERVAL_S`` and, past the queue's ``processing.memoryLimit``,
writes the reason beside the process's crash journal and exits at once. The record whose call
was running is blamed like any record that killed its process (queueplane.run.executor.crash_journal),
and ends in the DLQ as ``MemoryLimitExceeded`` after ``deliveryLimit`` deliveries.

A process overshoots by what it allocates in one ``INTERVAL_S`` (measured at about 3 GB/s: 10 to
50 MiB past a 768 MiB limit). Further below the limit the guard reads less often: no sooner than
a process growing that fast could reach the limit (``GROWTH_BYTES_PER_S``), and at least once a
second. Read every ``INTERVAL_S``, the guard would be most of an idle worker's Python time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from queueplane.run.dead_letters import Failure

log = logging.getLogger("queueplane.worker")

MEMORY_LIMIT_EXCEEDED = "MemoryLimitExceeded"
INTERVAL_S = 0.05  # the shortest wait between reads, near the limit
LONGEST_INTERVAL_S = 1.0
GROWTH_BYTES_PER_S = 3 << 30  # the fastest a handler's process was measured to grow
EXIT_CODE = 137  # what a container killed by the OOM killer exits with: the same signal to whoever watches
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(statm: int | None = None) -> int:
    """This process's resident set size, from /proc (a read of one short line).

    ``statm``: this process's ``/proc/self/statm``, kept open (each read is new figures)."""
    if statm is None:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    return int(os.pread(statm, 128, 0).split()[1]) * _PAGE


def next_read_s(resident: int, limit: int, shortest_s: float = INTERVAL_S) -> float:
    """How long the guard may wait before it reads again: until a process growing at
    ``GROWTH_BYTES_PER_S`` could have passed ``limit``, within ``shortest_s`` and a second."""
    return min(max((limit - resident) / GROWTH_BYTES_PER_S, shortest_s), LONGEST_INTERVAL_S)


class MemoryGuard:
    """Watches this process's memory from a daemon thread; ``ending`` is told why before it exits."""

    def __init__(self, limit_bytes: int, ending: Callable[[Failure], None], interval_s: float = INTERVAL_S):
        self.limit_bytes = limit_bytes
        self._ending = ending
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._watch, name="qp-memory-guard", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        limit = self.limit_bytes
        statm = os.open("/proc/self/statm", os.O_RDONLY)  # opened in the guarded process: its own figures
        wait_s = self._interval_s
        while True:
            time.sleep(wait_s)
            resident = resident_bytes(statm)
            if resident > limit:
                self._exit(resident)
            wait_s = next_read_s(resident, limit, self._interval_s)

    def _exit(self, resident: int) -> None:
        reason = Failure(
            MEMORY_LIMIT_EXCEEDED,
            f"the handler's process reached {resident >> 20} MiB, over processing.memoryLimit"
            f" ({self.limit_bytes >> 20} MiB), and was ended",
        )
        try:
            self._ending(reason)
        except Exception:  # the exit must happen whatever the journal can still write
            log.exception("the memory guard could not record why its process ends")
        log.error("%s: %s; this Python worker exits", reason.error_class, reason.message)
        os._exit(EXIT_CODE)


def guard(limit_mi: int | None, ending: Callable[[Failure], None]) -> MemoryGuard | None:
    """A guard at ``limit_mi`` MiB, or none when the queue sets no limit."""
    return MemoryGuard(limit_mi << 20, ending) if limit_mi else None
