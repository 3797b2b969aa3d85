"""What a Spark Python worker keeps for a queue (queueplane.run.processes.PerProcess)."""

from __future__ import annotations

import gc
import sys

from queueplane.run.processes import PerProcess


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
