"""What a Spark Python worker keeps for a queue (queueplane.run.executor.processes.PerProcess)."""

from __future__ import annotations

import gc
import sys
import weakref

from queueplane.run.executor import processes
from queueplane.run.executor.processes import PerProcess


class Kept:
    """Stands for a runtime's per-process state: a plain object the collector tracks."""

    def __init__(self, settings: str):
        self.settings = settings

    def close(self) -> None:
        pass


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_the_state_a_process_builds_once_is_kept_out_of_later_collections():
    switch = sys.getswitchinterval()
    registry = PerProcess(Kept)
    try:
        kept = registry.get('{"queue": "a"}')
        assert registry.get('{"queue": "a"}') is kept
        # pyspark collects after every task: what lives as long as the process is frozen out of it ...
        assert not _tracked(kept)
        # ... while what a task makes afterwards is collected as usual.
        later = Kept("a task's")
        assert _tracked(later)
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch)


class Hooked(Kept):
    """A runtime's state for a queue whose hooks the test gives (they note what ran, in order)."""


def _hooks_noting(happened: list[str]):
    from queueplane.run.executor.handler import ProcessHooks

    return lambda _settings: ProcessHooks(lambda: happened.append("setup"), lambda: happened.append("teardown"))


def test_setup_runs_once_before_the_state_is_used_and_again_after_a_drain():
    happened: list[str] = []
    registry = PerProcess(Hooked, _hooks_noting(happened))
    try:
        registry.get('{"queue": "h"}')
        registry.get('{"queue": "h"}')
        assert happened == ["setup"]
        registry.drained('{"queue": "h"}')
        assert happened == ["setup", "teardown"]
        registry.get('{"queue": "h"}')  # the next batch after a drain that was not the last
        assert happened == ["setup", "teardown", "setup"]
    finally:
        processes._REGISTRIES.remove(registry)
        gc.unfreeze()


def test_teardown_runs_before_a_daemon_worker_ends_and_not_between_its_tasks(monkeypatch):
    happened: list[str] = []
    registry = PerProcess(Hooked, _hooks_noting(happened))
    monkeypatch.setattr(processes, "_hangup_watched", True)  # no signal mask in the test's own process
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    codes = iter([0, -1])

    def task(*_args: object) -> int:
        registry.get('{"queue": "d"}')
        return next(codes)

    worker = processes.teardown_at_exit(task)
    try:
        assert worker() == 0 and happened == ["setup"], "a reused worker keeps its setup between tasks"
        assert worker() == -1 and happened == ["setup", "teardown"], "the socket closed: the process ends"
    finally:
        processes._REGISTRIES.remove(registry)
        gc.unfreeze()


class Cycle:
    """Garbage only a collection frees: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


def test_between_tasks_a_full_collection_runs_once_a_minute_at_most():
    now = [100.0]
    after_task = processes.AfterTaskCollection(every_s=60.0, clock=lambda: now[0])
    generations: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    automatic = gc.isenabled()
    gc.disable()  # only the collections asked for are seen
    gc.callbacks.append(seen)
    try:
        garbage = Cycle()
        gone = weakref.ref(garbage)
        del garbage
        now[0] += 59.0
        assert after_task.collect() == 0
        assert generations == [] and gone() is not None, "no collection within the minute"
        now[0] += 1.0
        assert after_task.collect() > 0
        assert generations == [2] and gone() is None, "a full collection once the minute is up"
        now[0] += 30.0
        after_task.collect()
        assert generations == [2], "the minute counts from the last full collection"
    finally:
        gc.callbacks.remove(seen)
        if automatic:
            gc.enable()
