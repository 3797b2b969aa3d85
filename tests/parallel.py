"""How `make test` splits the suite across pytest-xdist processes (``-n N --dist loadfile``).

Each process has its own Kafka broker and Airflow home, so most test files can run beside any
other. Some folders share a session resource and go to one process whole: the machine has one
local Kubernetes (a second process would stop it under the first), Airflow's migrated metadata
DB and the packaging tests' wheel are each made once per process.

Tests marked ``heavy`` (many JVMs, broker restarts, load steps timed in seconds) run alone: on
a small machine anything beside them starves them past the time bounds they wait with (a share
lock expiring, a Python worker not connecting back in time, executors due within two autoscaler
decisions). Light tests run side by side, and first. The Kubernetes deploy and upgrade tests
are not heavy although they run pods: their bounds are minutes, so they run beside the light
tests, and their waits on pods and rollouts overlap the light tests' work. So does the soak
test, which asserts memory and counts rather than time.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).parent
SHARED_BY_FOLDER = ("kubernetes", "airflow", "packaging")
FOLDER_ORDER = ("kubernetes", "integration", "packaging", "airflow", "unit")
HEAVY = "heavy"


def folder(nodeid: str) -> str:
    """The first folder under tests/ of a node id (``tests/unit/test_x.py::test_y`` → ``unit``)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if parts[0] == TESTS.name and len(parts) > 2 else parts[0]


def in_run_order(items: list[pytest.Item]) -> None:
    """Light tests first, by FOLDER_ORDER, then the heavy ones; each file keeps its order.

    While light tests remain, a heavy test waits for the one beside it to end; at the end only
    heavy tests are left, and the processes hand the lock to each other without waiting.
    """
    rank = {name: index for index, name in enumerate(FOLDER_ORDER)}
    items.sort(key=lambda item: (item.get_closest_marker(HEAVY) is not None, rank.get(folder(item.nodeid), len(rank))))


@contextmanager
def heavy_tests_alone(item: pytest.Item) -> Iterator[None]:
    """A heavy test runs alone; light tests run beside each other (only when processes share the run).

    A readers-writer lock over files: light tests hold the run's lock shared, a heavy test holds it
    exclusive. A heavy test waiting holds the gate, so no new light test starts and it is not
    starved by light tests that follow each other.
    """
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    files = Path(tempfile.gettempdir()) / f"queueplane-tests-{run}"
    heavy = item.get_closest_marker(HEAVY) is not None
    with open(f"{files}.gate", "w") as gate, open(f"{files}.lock", "w") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if heavy else fcntl.LOCK_SH)
        finally:
            if not heavy:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if heavy:
                fcntl.flock(gate, fcntl.LOCK_UN)


class SharedFolderScheduling(LoadScopeScheduling):
    """xdist's loadfile, except that each folder of SHARED_BY_FOLDER is one unit of work.

    (pytest-xdist's own ``xdist_group`` marks are not used: with pytest 9.2 they no longer
    reach the node ids that loadgroup reads, and tests of one group ran in several processes.)
    """

    def _split_scope(self, nodeid: str) -> str:
        name = folder(nodeid)
        return name if name in SHARED_BY_FOLDER else nodeid.split("::", 1)[0]
