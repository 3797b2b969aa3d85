"""How `make test` splits the suite across pytest-xdist processes (``-n N --dist loadfile``).

Each process has its own Kafka broker and Airflow home, so most test files can run beside any
other. Some folders share a session resource and go to one process whole: the machine has one
local Kubernetes (a second process would stop it under the first), Airflow's migrated metadata
DB and the packaging tests' wheel are each made once per process.

Tests marked ``heavy`` (many JVMs, broker restarts, load steps timed in seconds) run alone: on
a small machine anything beside them starves them past the time bounds they wait with (a share
lock expiring, a Python worker not connecting back in time, executors due within two autoscaler
decisions). Those marked ``heavy(paired=True)``, the fault tests that mostly wait, may run two
at once (tests/run_lock.py). Light tests run side by side, and first. The Kubernetes deploy and
upgrade tests are not heavy although they run pods: their bounds are minutes, so they run beside
the light tests, and their waits on pods and rollouts overlap the light tests' work. A stack
that keeps working between tests (Airflow, tests/airflow_stack.py) counts as light from its
start to its stop, not only during its tests: started beside a heavy test, Airflow's processes
took the CPU a Spark worker needed to connect back to its JVM in time.

Each process also counts its CPU, everything it starts included (tests/cpu_accounting.py), so
the run's timeline says what each test costs the machine, not only how long it took.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cpu_accounting
import pytest
import run_lock
from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).parent
SHARED_BY_FOLDER = ("kubernetes", "airflow", "packaging")
# The two longest units of work first, each in a process of its own from the start: placed after
# the integration files, Airflow's folder (about 10 min, run in one process) was the run's tail.
FOLDER_ORDER = ("kubernetes", "airflow", "integration", "packaging", "unit")
HEAVY = "heavy"

# `make check`, the fast loop: every unit test, and the integration tests against the real broker
# that start no Spark worker (each test that does costs half a minute to two of CPU). A new
# integration file is left out until it is listed here.
CHECK = "check"
CHECK_INTEGRATION = (
    "test_acl_apply.py",
    "test_apply.py",
    "test_backlog_age.py",
    "test_guardrails.py",
    "test_kmq_resume.py",
    "test_local_stack.py",
    "test_plan_batching.py",
    "test_private_state.py",
    "test_queue_status.py",
    "test_removal.py",
    "test_served_producer.py",
    "test_share_fetcher.py",
    "test_share_group_members.py",
    "test_team_names.py",
    "test_worker_preflight.py",
)


def folder(nodeid: str) -> str:
    """The first folder under tests/ of a node id (``tests/unit/test_x.py::test_y`` → ``unit``)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if parts[0] == TESTS.name and len(parts) > 2 else parts[0]


def mark_check(items: list[pytest.Item]) -> None:
    """Mark ``check`` the tests `make check` runs (``-m 'check and not heavy'``)."""
    for item in items:
        name = folder(item.nodeid)
        if name == "unit" or (name == "integration" and item.nodeid.split("::", 1)[0].endswith(CHECK_INTEGRATION)):
            item.add_marker(CHECK)


def in_run_order(items: list[pytest.Item]) -> None:
    """Light tests first, by FOLDER_ORDER, then the heavy ones; each file keeps its order.

    While light tests remain, a heavy test waits for the one beside it to end; at the end only
    heavy tests are left, and the processes hand the lock to each other without waiting.
    """
    rank = {name: index for index, name in enumerate(FOLDER_ORDER)}
    items.sort(key=lambda item: (item.get_closest_marker(HEAVY) is not None, rank.get(folder(item.nodeid), len(rank))))


_group: cpu_accounting.ProcessGroup | None = None  # this process's CPU accounting, where the machine has it
_cpu_counted = 0.0  # the group's CPU time at the end of the last test phase


def process_started() -> None:
    """An xdist worker of a run counts its CPU in a group of its own, where it may."""
    global _group
    run, worker = os.environ.get("PYTEST_XDIST_TESTRUNUID"), os.environ.get("PYTEST_XDIST_WORKER")
    if run and worker and cpu_accounting.available():
        _group = cpu_accounting.ProcessGroup(run, worker)
        _group.join()


def process_ending() -> None:
    if _group is not None:
        _group.leave()


def phase_cpu_seconds() -> float | None:
    """The CPU time this process and everything it started took since the last phase ended
    (the test phase just ended), where the machine counts it."""
    global _cpu_counted
    now = _group.cpu_seconds() if _group is not None else None
    if now is None:
        return None
    spent, _cpu_counted = now - _cpu_counted, now
    return spent


_light_holds = 0  # open light holds of this process: its background stacks and the tests beside them


@contextmanager
def _run_lock(kind: str) -> Iterator[None]:
    """The run's lock (tests/run_lock.py), only when processes share the run.

    A process that already holds it light (a module's background stack) lets its own light tests
    through without asking again: asking would queue them behind a heavy test that waits for that
    very hold.
    """
    global _light_holds
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    if kind != run_lock.LIGHT and _light_holds:
        raise RuntimeError("a heavy test cannot run while its own process keeps a background stack running")
    with contextlib.ExitStack() as held:
        if kind != run_lock.LIGHT or not _light_holds:
            lock = run_lock.RunLock(Path(tempfile.gettempdir()) / f"queueplane-tests-{run}.json")
            held.enter_context(lock.held(kind))
        if kind == run_lock.LIGHT:
            _light_holds += 1
            held.callback(_release_light)
        yield


def _release_light() -> None:
    global _light_holds
    _light_holds -= 1


def kind_of(item: pytest.Item) -> str:
    """light, heavy, or paired: heavy, but one other paired test may run beside it."""
    marker = item.get_closest_marker(HEAVY)
    if marker is None:
        return run_lock.LIGHT
    return run_lock.PAIRED if marker.kwargs.get("paired") else run_lock.HEAVY


def heavy_tests_alone(item: pytest.Item) -> contextlib.AbstractContextManager[None]:
    """A heavy test runs alone (a paired one beside one other paired test at most); light tests
    run beside each other (only when processes share the run)."""
    return _run_lock(kind_of(item))


def background_stack() -> contextlib.AbstractContextManager[None]:
    """Held by a stack from its start to its stop while it works between tests (Airflow's
    scheduler and DAG processor): that stack is load a heavy test must not have beside it, least of
    all while it starts. Its start waits for a running heavy test to end, and a heavy test waits
    for the stack to stop."""
    return _run_lock(run_lock.LIGHT)


class SharedFolderScheduling(LoadScopeScheduling):
    """xdist's loadfile, except that each folder of SHARED_BY_FOLDER is one unit of work.

    (pytest-xdist's own ``xdist_group`` marks are not used: with pytest 9.2 they no longer
    reach the node ids that loadgroup reads, and tests of one group ran in several processes.)
    """

    def _split_scope(self, nodeid: str) -> str:
        name = folder(nodeid)
        return name if name in SHARED_BY_FOLDER else nodeid.split("::", 1)[0]
