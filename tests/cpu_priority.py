"""The CPU shares of `make test`'s processes: a heavy test's process first, the others on what is left.

Each pytest process of a run puts itself in a control group of its own at its start, so every
process it starts later (brokers, Spark drivers and their Python workers, a standalone master,
the local Kubernetes' components, even those that detach into sessions of their own) counts
with it. While one process runs a heavy test, its group gets many times the default CPU weight
and the others' groups a fraction of it: the heavy test's bounds in seconds hold as they did
when it ran alone, and the light tests beside it go on with the CPU it leaves (a heavy test
waits on brokers and pods much of the time; run alone, the machine's two cores were 10 to 50%
busy). Pods are in the kubelet's own group, with the node's weight: a heavy test outweighs
it too, unless its own load is in pods (the Kubernetes autoscale test's executors): then its
process keeps the default weight, and only the other processes go on what is left.

The same groups count each process's CPU time (``cpu_seconds``: cgroup v1's ``cpuacct``
hierarchy, or v2's ``cpu.stat``), which the run's timeline keeps per test: on two cores busy
through most of the run, the CPU a test takes, not its length, is what it costs the run.

Needs root and the ``cpu`` controller (cgroup v1, or v2 with ``cpu`` delegated at its root);
``available()`` says whether this machine gives both. Without them, heavy tests run alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpu")
V1_ACCOUNTING = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")
PREFIX = "queueplane-tests-"
# (cgroup v1 cpu.shares, cgroup v2 cpu.weight): the default, a heavy test's process, the others.
NORMAL = (1024, 100)
FIRST = (16384, 1600)
LEFTOVER = (128, 12)


def _root() -> tuple[Path, int] | None:
    """The hierarchy's root and which version it is (1 or 2), when this process may use it."""
    if os.geteuid() != 0:
        return None
    if (V1 / "cpu.shares").is_file():
        return V1, 1
    with contextlib.suppress(OSError):
        if "cpu" in (V2 / "cgroup.subtree_control").read_text().split():
            return V2, 2
    return None


def available() -> bool:
    return _root() is not None


def _set_weight(group: Path, version: int, weights: tuple[int, int]) -> None:
    name, value = ("cpu.shares", weights[0]) if version == 1 else ("cpu.weight", weights[1])
    with contextlib.suppress(OSError):  # a group whose process has ended and removed it
        (group / name).write_text(str(value))


class ProcessGroups:
    """This run's groups, one per pytest process, named ``queueplane-tests-<run>-<process>``."""

    def __init__(self, run: str, process: str):
        found = _root()
        if found is None:
            raise RuntimeError("no CPU control group this process may write to")
        self.root, self.version = found
        self.prefix = f"{PREFIX}{run}-"
        self.own = self.root / f"{self.prefix}{process}"
        # Where its CPU time is counted: the same group on v2, a twin in cpuacct's hierarchy on v1.
        accounting = V1_ACCOUNTING if self.version == 1 else self.root
        self.counted = accounting / self.own.name if (accounting / "cgroup.procs").is_file() else None

    def join(self) -> None:
        """This process, and so everything it starts from now on, into its own group (and the
        groups of earlier runs removed, once nothing is left in them)."""
        for stale in [*self.root.glob(f"{PREFIX}*"), *V1_ACCOUNTING.glob(f"{PREFIX}*")]:
            if not stale.name.startswith(self.prefix):
                with contextlib.suppress(OSError):
                    stale.rmdir()
        self.own.mkdir(exist_ok=True)
        _set_weight(self.own, self.version, NORMAL)
        (self.own / "cgroup.procs").write_text(str(os.getpid()))
        if self.counted is not None and self.counted != self.own:
            self.counted.mkdir(exist_ok=True)
            (self.counted / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_seconds(self) -> float | None:
        """CPU time of every process in the group since it was made (None where it is not counted)."""
        if self.counted is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            if self.version == 1:
                return int((self.counted / "cpuacct.usage").read_text()) / 1e9
            stat = dict(line.split() for line in (self.counted / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return None

    def leave(self) -> None:
        """Every process still in the group (this one, and what a test left running) back to the
        root, and the group removed."""
        for group in {self.own, self.counted} - {None}:
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):  # ended meanwhile
                        (group.parent / "cgroup.procs").write_text(pid)
                group.rmdir()

    @contextlib.contextmanager
    def first(self, load_in_pods: bool = False) -> Iterator[None]:
        """This process's group first while in the block (its pods first, when its load is in
        pods), the run's other groups on what it leaves."""
        others = [group for group in self.root.glob(f"{self.prefix}*") if group != self.own]
        _set_weight(self.own, self.version, NORMAL if load_in_pods else FIRST)
        for group in others:
            _set_weight(group, self.version, LEFTOVER)
        try:
            yield
        finally:
            for group in (self.own, *others):
                _set_weight(group, self.version, NORMAL)
