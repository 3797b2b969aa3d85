"""What each process of a benchmark run cost: peak resident memory and CPU time, by role.

Every worker benchmark samples its own process tree (the driver, Spark's JVM, its Python
workers, the local broker, a baseline's plain processes) the same way, so the sides of one
run are compared on the same accounting.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Peak resident memory of this process, its Spark JVM, the Spark Python workers and the broker;
    and the CPU time each of them (and the plain loop's processes) used.

    The local broker and the plain loop's process are children of this process too: the
    broker's JVM is reported apart from the driver's, and the loop is left out of the memory.
    CPU time says what a run cost the machine beyond the records/s: on two cores the broker,
    Spark's JVM and the Python processes share the same cores.
    """

    def __init__(self) -> None:
        self.peak = {"driver_python_mb": 0.0, "driver_jvm_mb": 0.0, "python_workers_mb": 0.0, "broker_jvm_mb": 0.0}
        self._cpu: dict[int, tuple[str, int]] = {}  # pid → (role, CPU ticks last seen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far by role, of every process seen (one that ended keeps its last reading)."""
        totals: dict[str, float] = {}
        for role, ticks in list(self._cpu.values()):
            totals[role] = round(totals.get(role, 0.0) + ticks / CLOCK_TICKS, 2)
        return totals

    def cost_per_100k(self, before: dict[str, float], records: int) -> dict[str, float]:
        """CPU seconds per 100k records by role since ``before`` (a ``cpu_seconds()`` reading)."""
        time.sleep(0.5)  # a last reading of the processes that ran it
        after = self.cpu_seconds()
        return {
            role: round((seconds - before.get(role, 0.0)) * 100_000 / records, 2)
            for role, seconds in after.items()
            if seconds > before.get(role, 0.0)
        }

    @staticmethod
    def _processes() -> list[tuple[int, int, str, float, int]]:
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                ppid = int(fields[1])
                ticks = int(fields[11]) + int(fields[12])  # utime + stime
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                rss = (
                    next(
                        int(line.split()[1])
                        for line in (entry / "status").read_text().splitlines()
                        if line.startswith("VmRSS:")
                    )
                    / 1024
                )
            except (OSError, StopIteration, ValueError, IndexError):
                continue
            out.append((int(entry.name), ppid, cmd, rss, ticks))
        return out

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            procs = self._processes()
            children: dict[int, list[int]] = {}
            for pid, ppid, *_ in procs:
                children.setdefault(ppid, []).append(pid)
            tree, todo = set(), [me]
            while todo:
                pid = todo.pop()
                tree.add(pid)
                todo.extend(children.get(pid, []))
            workers = jvm = python = broker = 0.0
            for pid, _, cmd, rss, ticks in procs:
                if pid not in tree:
                    continue
                if pid == me:
                    python = rss
                    self._cpu[pid] = ("benchmark", ticks)
                elif "java" in cmd.split(" ")[0]:
                    if "kafka.Kafka" in cmd:
                        broker += rss
                        self._cpu[pid] = ("broker_jvm", ticks)
                    else:
                        jvm += rss
                        self._cpu[pid] = ("spark_jvm", ticks)
                elif "multiprocessing" in cmd:
                    self._cpu[pid] = ("plain_processes", ticks)
                    continue  # a baseline's process (the plain loop, the hosted process half), not the worker
                elif "pyspark" in cmd or "daemon" in cmd or "worker" in cmd or "python" in cmd:
                    workers += rss
                    self._cpu[pid] = ("python_workers", ticks)
            for key, value in (
                ("driver_python_mb", python),
                ("driver_jvm_mb", jvm),
                ("python_workers_mb", workers),
                ("broker_jvm_mb", broker),
            ):
                self.peak[key] = max(self.peak[key], round(value, 1))
            time.sleep(0.2)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
