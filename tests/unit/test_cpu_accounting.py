"""`make test`'s CPU accounting: a process's group counts the CPU of what it starts."""

from __future__ import annotations

import os
import time
import uuid

import cpu_accounting
import pytest

pytestmark = pytest.mark.skipif(not cpu_accounting.available(), reason="needs root and a CPU control group")


def test_a_group_counts_the_cpu_of_a_process_started_in_it_and_is_removed_at_the_end():
    group = cpu_accounting.ProcessGroup(uuid.uuid4().hex[:8], "gw9")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            group.join()
            os.write(write, b"in")
            child = os.fork()  # started after the join: counted with it
            if child == 0:
                until = time.process_time() + 0.5
                while time.process_time() < until:
                    pass
                os._exit(0)
            os.waitpid(child, 0)
        finally:
            os._exit(0)
    assert os.read(read, 2) == b"in"
    before = group.cpu_seconds()
    os.waitpid(pid, 0)
    spent = group.cpu_seconds() - before
    assert 0.4 < spent < 5, spent
    group.leave()
    assert not group.path.exists(), "the run's groups are removed at its end"
