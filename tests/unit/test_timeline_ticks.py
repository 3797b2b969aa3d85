"""`make test`'s timeline records the machine's CPU time with each phase (tests/timeline.py)."""

from __future__ import annotations

import os
import time

import timeline


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
