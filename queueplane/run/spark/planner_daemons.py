"""Spark's planning daemons that have nothing left to plan, stopped.

Spark plans a Python data source (the share source) on the driver, in Python processes it
forks from a daemon per planning step (``pyspark.sql.worker.create_data_source``,
``plan_data_source_read``, ``lookup_data_sources``) and per worker environment, and keeps
every daemon for the life of the application: there is no call to stop one. A share queue
runs its source in an environment of its own (``share/source.py``), so each share queue of
an application left two of them behind once its query had started (about 47 MB each,
measured by bench/footprint.py), used again only when a query starts again.

``PlannerReaper`` stops a planning daemon of this application's JVM once it has had no
worker for ``idle_s``. Spark starts another when it needs one: it takes a connection the
daemon's port refuses for a daemon that quit, and starts it again (PythonWorkerFactory,
"Assuming that daemon unexpectedly quit, attempting to restart", Spark 4.2). The daemons
Spark runs tasks with (``pyspark.worker``) are left alone: they hold the share queues'
long-lived processes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger("queueplane.worker")

PLANNER_MODULES = "pyspark.sql.worker."
IDLE_S = 60.0
CHECK_S = 15.0


def _processes() -> dict[int, tuple[int, list[str]]]:
    """Every process's parent and command line (those that end while being read are left out)."""
    found: dict[int, tuple[int, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry.name)] = (ppid, [part for part in command if part])
    return found


def is_planner_daemon(command: list[str]) -> bool:
    """``python -m pyspark.daemon pyspark.sql.worker.<step>``: a daemon that forks planning workers."""
    return len(command) >= 2 and command[-2] == "pyspark.daemon" and command[-1].startswith(PLANNER_MODULES)


class PlannerReaper:
    """Stops the planning daemons of one JVM that have had no worker for ``idle_s``."""

    def __init__(self, jvm_pid: int, idle_s: float = IDLE_S, check_s: float = CHECK_S):
        self.jvm_pid = jvm_pid
        self.idle_s = idle_s
        self.check_s = check_s
        self._idle_since: dict[int, float] = {}  # daemon pid → when it was first seen without a worker
        self._stop = threading.Event()

    def sweep(self, now: float) -> list[int]:
        """One look: the daemons stopped by it."""
        processes = _processes()
        parents = {ppid for ppid, _ in processes.values()}
        daemons = {
            pid for pid, (ppid, command) in processes.items() if ppid == self.jvm_pid and is_planner_daemon(command)
        }
        self._idle_since = {pid: since for pid, since in self._idle_since.items() if pid in daemons}
        stopped = []
        for pid in sorted(daemons):
            if pid in parents:  # a worker runs, or waits in Spark's pool of idle workers
                self._idle_since.pop(pid, None)
                continue
            since = self._idle_since.setdefault(pid, now)
            if now - since >= self.idle_s:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                else:
                    stopped.append(pid)
                self._idle_since.pop(pid, None)
        if stopped:
            log.info(
                "stopped %d planning daemon(s) idle for %.0fs: Spark starts them again when it plans",
                len(stopped),
                self.idle_s,
            )
        return stopped

    def run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.sweep(time.monotonic())
            except Exception:  # memory it could not give back is no reason to stop the queues
                log.warning("the look for idle planning daemons failed", exc_info=True)

    def start(self) -> PlannerReaper:
        threading.Thread(target=self.run, name="qp-planner-reaper", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
