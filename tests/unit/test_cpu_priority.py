"""`make test`'s CPU groups: a heavy test's process takes the CPU first, the others go on with the rest."""

from __future__ import annotations

import os
import time
import uuid

import cpu_priority
import pytest

pytestmark = pytest.mark.skipif(not cpu_priority.available(), reason="needs root and the cpu control group")


def _burner(groups: cpu_priority.ProcessGroups, go_at: float, seconds: float) -> tuple[int, int]:
    """A child on CPU 0 in ``groups``' own group that spins from ``go_at`` for ``seconds``; its
    pid and a pipe that gives its CPU time (ms) when it ends."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {0})
            groups.join()
            while time.monotonic() < go_at:
                time.sleep(0.01)
            begun = time.process_time()
            while time.monotonic() < go_at + seconds:
                pass
            os.write(write, str(int((time.process_time() - begun) * 1000)).encode())
        finally:
            os._exit(0)
    os.close(write)
    return pid, read


def test_the_heavy_tests_process_takes_the_cpu_and_the_others_get_what_it_leaves():
    run = uuid.uuid4().hex[:8]
    heavy, light = cpu_priority.ProcessGroups(run, "heavy"), cpu_priority.ProcessGroups(run, "light")
    go_at = time.monotonic() + 0.5
    children = [_burner(heavy, go_at, 2.0), _burner(light, go_at, 2.0)]
    while not (heavy.own.is_dir() and light.own.is_dir()):
        time.sleep(0.01)
    try:
        with heavy.first():
            cpu_ms = []
            for pid, read in children:
                os.waitpid(pid, 0)
                cpu_ms.append(int(os.read(read, 32) or b"0"))
        # Both spun on one core for 2 s: the heavy one had nearly all of it, the light one not none.
        heavy_ms, light_ms = cpu_ms
        assert heavy_ms > 10 * light_ms, cpu_ms
        assert light_ms > 0, cpu_ms
    finally:
        heavy.leave()
        light.leave()
    assert not heavy.own.exists() and not light.own.exists(), "the run's groups are removed at its end"
