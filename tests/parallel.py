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
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
HEAVY_PART = " (heavy)"  # a shared folder's heavy tests: a unit of their own

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
            lock = run_lock.RunLock(Path(tempfile.gettempdir()) / _run_file(run, ".json"))
            held.enter_context(lock.held(kind))
        if kind == run_lock.LIGHT:
            _light_holds += 1
            held.callback(_release_light)
        yield


def _release_light() -> None:
    global _light_holds
    _light_holds -= 1


def timeout_from_now(item: pytest.Item) -> None:
    """Start the test's pytest-timeout anew: a test that waited for the run's lock (the heavy ones
    at the end wait for each other) has its whole timeout from when it got it."""
    import pytest_timeout

    settings = pytest_timeout._get_item_settings(item)
    if settings.timeout and not settings.func_only:
        hooks = item.config.pluginmanager.hook
        hooks.pytest_timeout_cancel_timer(item=item)
        hooks.pytest_timeout_set_timer(item=item, settings=settings)


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


def run_started(config: pytest.Config) -> None:
    """The run's controller names the run (xdist's testrunuid) before its processes start, so
    its scheduler finds the file they write their heavy tests to (``note_kinds``)."""
    if not hasattr(config, "workerinput") and config.getoption("testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex


def run_ended(config: pytest.Config) -> None:
    """The controller removes the run's files (the lock's, the kinds') once its processes ended."""
    run = config.getoption("testrunuid", None)
    if not hasattr(config, "workerinput") and run:
        for path in Path(tempfile.gettempdir()).glob(f"{_run_file(run, '')}*"):
            path.unlink(missing_ok=True)


def _run_file(run: str, suffix: str) -> str:
    return f"queueplane-tests-{run}{suffix}"


def _kinds_file(run: str) -> Path:
    return Path(tempfile.gettempdir()) / _run_file(run, "-kinds.json")


def note_kinds(items: list[pytest.Item]) -> None:
    """In each process of a run: the node ids of the tests that are not light, and their kind,
    for the controller's scheduler (which sees node ids only). Every process writes the same."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return
    kinds = {item.nodeid: kind for item in items if (kind := kind_of(item)) != run_lock.LIGHT}
    path = _kinds_file(run)
    written = path.with_name(f"{path.name}.{os.getpid()}")
    written.write_text(json.dumps(kinds))
    os.replace(written, path)


class SharedFolderScheduling(LoadScopeScheduling):
    """xdist's loadfile, with the heavy tests kept for the end.

    - Each folder of SHARED_BY_FOLDER is one unit of work, and its heavy tests another, which
      goes to the process that ran the first (the one holding the folder's session resources).
    - A unit with a heavy test is handed out only once every light test has been, and only to a
      process with nothing left to run: given earlier, each one stopped the light tests of every
      process while it waited for the lock and ran (xdist hands a process its next unit while two
      of its tests are pending, so one process took all three heavy files mid-run). The paired
      units go out first, to two processes. The lock then runs the heavy units one by one (the
      paired two together); a test's timeout counts from when it got the lock.

    (pytest-xdist's own ``xdist_group`` marks are not used: with pytest 9.2 they no longer
    reach the node ids that loadgroup reads, and tests of one group ran in several processes.)
    """

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._kinds: dict[str, str] | None = None
        self._heavy_units: set[str] = set()
        self._paired_units: set[str] = set()  # heavy units whose heavy tests are all paired
        self._homes: dict[str, Any] = {}  # a shared folder -> the process that ran its light tests

    def _kind(self, nodeid: str) -> str:
        if self._kinds is None:
            run = self.config.getoption("testrunuid", None)
            path = _kinds_file(run) if run else None
            self._kinds = json.loads(path.read_text()) if path is not None and path.exists() else {}
        return self._kinds.get(nodeid, run_lock.LIGHT)

    def _split_scope(self, nodeid: str) -> str:
        name = folder(nodeid)
        if name not in SHARED_BY_FOLDER:
            return nodeid.split("::", 1)[0]
        return f"{name}{HEAVY_PART}" if self._kind(nodeid) != run_lock.LIGHT else name

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed:
            collection = next(iter(self.registered_collections.values()), [])
            self._heavy_units = {self._split_scope(n) for n in collection if self._kind(n) != run_lock.LIGHT}
            alone = {self._split_scope(n) for n in collection if self._kind(n) == run_lock.HEAVY}
            self._paired_units = self._heavy_units - alone
        super().schedule()

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in list(self.assigned_work):  # an idle process may take a heavy unit now
            if other is not node:
                self._reschedule(other)

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if any(scope not in self._heavy_units for scope in self.workqueue):
            super()._reschedule(node)
            return
        # Only heavy units are left. A process holds back its last test until it knows the next
        # one, so one pending test is an idle process; they go out once every process is done
        # with its light tests but that one.
        if self._pending_of(self.assigned_work[node]) > 1 or any(
            self._light_pending(work) > 1 for work in self.assigned_work.values()
        ):
            return
        scope = self._heavy_unit_for(node)
        if scope is not None:
            self._assign_work_unit(node, scope)

    def _light_pending(self, work: dict[str, dict[str, bool]]) -> int:
        return sum(list(tests.values()).count(False) for scope, tests in work.items() if scope not in self._heavy_units)

    def _heavy_unit_for(self, node: Any) -> str | None:
        """The process's own folder's heavy tests first, then the paired units (so that they go
        to two processes and meet, even when there are more heavy units than processes), then the
        rest; never a folder's heavy tests that another live process holds."""
        own, paired, rest = [], [], []
        for scope in self.workqueue:
            home = self._homes.get(scope.removesuffix(HEAVY_PART))
            if home is node:
                own.append(scope)
            elif home is None or home not in self.assigned_work:
                (paired if scope in self._paired_units else rest).append(scope)
        return next(iter(own + paired + rest), None)

    def _assign_work_unit(self, node: Any, scope: str | None = None) -> None:
        """The given unit, or the first light one (xdist's schedule() asks without one)."""
        if scope is None:
            scope = next((s for s in self.workqueue if s not in self._heavy_units), None)
            if scope is None:
                self._reschedule(node)
                return
        work_unit = self.workqueue.pop(scope)
        if scope in SHARED_BY_FOLDER:
            self._homes[scope] = node
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
