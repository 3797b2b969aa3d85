"""`make test`'s timeline records the machine's CPU time with each phase (tests/timeline.py),
and bench/test_timeline.py counts the heavy tests' time from when they got the run's lock."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import timeline

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def report(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # for its `common`
    spec = importlib.util.spec_from_file_location("bench_test_timeline", BENCH / "test_timeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_machines_cpu_time_grows_by_what_a_process_burns_and_busy_never_passes_all():
    """Idle and iowait are the only ticks left out of busy; guest time is not counted twice."""
    before = timeline.machine_ticks()
    assert before is not None, "Linux has /proc/stat"
    until = time.process_time() + 0.3
    while time.process_time() < until:
        pass
    after = timeline.machine_ticks()
    assert after is not None
    busy, total = after[0] - before[0], after[1] - before[1]
    assert 0 < busy <= total
    assert busy >= 0.3 * os.sysconf("SC_CLK_TCK") * 0.9, "the 0.3 s this process burnt is busy time"


def _phase(test: str, phase: str, start: float, stop: float, **more: object) -> dict:
    return {
        "test": test,
        "process": "gw0",
        "heavy": "integration" in test,
        "phase": phase,
        "start": start,
        "stop": stop,
        **more,
    }


def _heavy(test: str, start: float, got_lock: float, stop: float, machine: tuple[int, int]) -> list[dict]:
    waited = {"at": got_lock, "waited_s": got_lock - start}
    return [
        _phase(test, "setup", start, got_lock + 1, run_lock=waited),
        _phase(test, "call", got_lock + 1, stop, machine=machine),
    ]


def test_paired_heavy_tests_count_once_and_from_when_they_had_the_machine(report, tmp_path):
    """Two paired tests overlapping from 100 s to 300 s, after waits of 60 and 90 s: 200 s of
    heavy time, not 410, and the machine's ticks meanwhile are theirs together."""
    lines = [
        _phase("tests/unit/test_a.py::t", "call", 0, 50, machine=(0, 0)),
        _phase("tests/unit/test_b.py::t", "call", 50, 99, machine=(90, 100)),
        *_heavy("tests/integration/test_x.py::t", 40, 100, 250, (150, 400)),
        *_heavy("tests/integration/test_y.py::t", 10, 100, 300, (180, 500)),
    ]
    path = tmp_path / "timeline.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tests, ticks = report.load(path)
    assert report.heavy_seconds(tests) == 200
    assert sum(t.lock_wait_s for t in tests if t.heavy) == 150
    busy = report.machine_busy(tests, ticks)
    assert busy["light"]["busy"] == 0.9
    assert busy["test_x.py + test_y.py"] == {"seconds": 151, "busy": 0.2}
