"""Where the suite's time goes: each test phase's start and stop, per pytest process.

`make test` sets QUEUEPLANE_TEST_TIMELINE to a file; the process that runs the suite (xdist's
controller, or pytest alone) appends one JSON line per test phase, and bench/test_timeline.py
draws them. The suite is split in processes and heavy tests run alone (parallel.py), so the
sum of the tests' durations says little about the run's length; the timeline shows which
process ran what when, and when each test got the run's lock after how long a wait. Where the
machine counts it, each phase also carries its process's CPU time (cpu_accounting.py), and the
whole machine's CPU time so far: a process's count misses what it asked others to run (the
local Kubernetes' pods), and the machine's says how busy the run kept the cores.
"""

from __future__ import annotations

import json
import os

import pytest
from parallel import HEAVY

ENV = "QUEUEPLANE_TEST_TIMELINE"


def record(report: pytest.TestReport) -> None:
    """Append the phase to the timeline file, once: xdist's workers leave it to the controller,
    which receives every report with the worker (``report.node``) it came from."""
    path = os.environ.get(ENV)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    node = getattr(report, "node", None)
    line = {
        "process": node.gateway.id if node is not None else "main",
        "test": report.nodeid,
        "phase": report.when,
        "start": report.start,
        "stop": report.stop,
        "outcome": report.outcome,
        "heavy": HEAVY in report.keywords,
        "cpu_s": getattr(report, "cpu_s", None),  # its process's CPU meanwhile, where counted
        "run_lock": dict(report.user_properties).get("run_lock") if report.when == "setup" else None,
        "machine": machine_ticks(),
    }
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def machine_ticks() -> tuple[int, int] | None:
    """The machine's CPU time so far, busy and in all, in clock ticks (the first line of Linux's
    /proc/stat); None elsewhere. Guest time is already counted in user time, so it is left out."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(field) for field in fields[1:9]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return sum(ticks) - idle, sum(ticks)
