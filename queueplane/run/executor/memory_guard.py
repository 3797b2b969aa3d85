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

A process overshoots by what it allocates in one interval (measured at about 3 GB/s: 10 to
50 MiB past a 768 MiB limit).
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
INTERVAL_S = 0.05
EXIT_CODE = 137  # what a container killed by the OOM killer exits with: the same signal to whoever watches
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident set size, from /proc (a read of one short line)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


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
        while True:
            time.sleep(self._interval_s)
            resident = resident_bytes()
            if resident > limit:
                self._exit(resident)

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
