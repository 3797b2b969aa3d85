"""How `make test` hands units of work to its processes (tests/parallel.py): heavy units last,
only to idle processes, a shared folder's heavy tests to the process that ran the folder."""

from __future__ import annotations

import json
from types import SimpleNamespace

import parallel
import pytest
import run_lock

K8S = [f"tests/kubernetes/test_deploy.py::test_{i}" for i in range(3)]
K8S_HEAVY = "tests/kubernetes/test_autoscale.py::test_load_step"
LIGHT = [f"tests/integration/test_light_{f}.py::test_{i}" for f in "abcd" for i in range(3)]
OUTAGE = "tests/integration/test_broker_outage.py::test_outage"
FAULTS = "tests/integration/test_network_faults.py::test_faults"
ALONE = "tests/integration/test_autoscale_standalone.py::test_load_step"
KINDS = {K8S_HEAVY: run_lock.HEAVY, OUTAGE: run_lock.PAIRED, FAULTS: run_lock.PAIRED, ALONE: run_lock.HEAVY}
# The order in_run_order gives: light tests first, the heavy ones last.
COLLECTION = [*K8S, *LIGHT, K8S_HEAVY, ALONE, OUTAGE, FAULTS]


class _Config:
    def __init__(self, run: str, processes: int) -> None:
        self.option = SimpleNamespace(tx=[f"{processes}*popen"], loadscopereorder=False, testrunuid=run)

    def getvalue(self, name: str) -> object:
        return getattr(self.option, name)

    def getoption(self, name: str, default: object = None) -> object:
        return getattr(self.option, name, default)


class _Process:
    """A worker as xdist's controller sees it: it runs a test only once it knows the next one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gateway = SimpleNamespace(id=name)
        self.queue: list[int] = []
        self.ran: list[str] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def runnable(self) -> bool:
        return len(self.queue) >= 2 or (self.shutting_down and bool(self.queue))

    def __repr__(self) -> str:
        return self.name


@pytest.fixture
def scheduler(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / "queueplane-tests-r1-kinds.json").write_text(json.dumps(KINDS))
    made = parallel.SharedFolderScheduling(_Config("r1", 3))
    processes = [_Process(f"gw{i}") for i in range(3)]
    for process in processes:
        made.add_node(process)
    for process in processes:
        made.add_node_collection(process, COLLECTION)
    made.schedule()
    return made, processes


def _run_one(made, process: _Process) -> str:
    index = process.queue.pop(0)
    process.ran.append(COLLECTION[index])
    made.mark_test_complete(process, index)
    return COLLECTION[index]


def test_heavy_units_go_out_only_once_every_light_one_ran_and_to_idle_processes(scheduler):
    made, processes = scheduler
    order: list[str] = []
    while any(p.runnable() for p in processes):
        process = next(p for p in processes if p.runnable())
        order.append(_run_one(made, process))
        if any(COLLECTION[i] in KINDS for p in processes for i in p.queue):
            # Handed out: the light tests left are each a process's last, held back until it
            # knows its next (it runs them now).
            left = [t for t in [*K8S, *LIGHT] if t not in order]
            assert all(any(p.queue and COLLECTION[p.queue[0]] == t for p in processes) for t in left), left
    assert sorted(order) == sorted(COLLECTION)
    assert all(p.shutting_down for p in processes)
    k8s_process = next(p for p in processes if K8S[0] in p.ran)
    assert K8S_HEAVY in k8s_process.ran, "the folder's heavy test runs where its cluster is"
    assert all(K8S[0] not in p.ran or K8S_HEAVY in p.ran for p in processes)
    holders = [p for p in processes if OUTAGE in p.ran or FAULTS in p.ran]
    assert len(holders) == 2, "the paired tests went to two processes, so they can meet"


def test_a_process_with_light_work_left_gets_no_heavy_unit(scheduler):
    made, processes = scheduler
    busy = next(p for p in processes if any(COLLECTION[i] in K8S for i in p.queue))
    # Everyone else runs all it has; the Kubernetes process still has its folder's tests.
    for process in processes:
        if process is busy:
            continue
        while process.runnable():
            _run_one(made, process)
    assert set(made.workqueue) == {
        "kubernetes (heavy)",
        ALONE.split("::")[0],
        OUTAGE.split("::")[0],
        FAULTS.split("::")[0],
    }
    assert not any(COLLECTION[i] in KINDS for p in processes for i in p.queue), "no heavy test handed out"
    while busy.runnable():
        _run_one(made, busy)
    assert any(COLLECTION[i] in KINDS for p in processes for i in p.queue), "now they go out"


def _handed(processes) -> set[str]:
    return {COLLECTION[i] for p in processes for i in p.queue if COLLECTION[i] in KINDS}


def test_the_paired_units_go_out_together_when_heavy_units_outnumber_the_processes(scheduler):
    """Three processes, four heavy units: the Kubernetes one goes home, and the paired two to the
    other two processes at once; the standalone autoscaling test goes out after them."""
    made, processes = scheduler
    while not _handed(processes):
        _run_one(made, next(p for p in processes if p.runnable()))
    assert _handed(processes) == {K8S_HEAVY, OUTAGE, FAULTS}
    assert len([p for p in processes if {COLLECTION[i] for i in p.queue} & {OUTAGE, FAULTS}]) == 2
