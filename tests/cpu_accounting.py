"""The CPU time of each of `make test`'s processes, everything it started included.

Each pytest process of a run puts itself in a control group of its own at its start, so every
process it starts later (brokers, Spark drivers and their Python workers, a standalone master,
the local Kubernetes' components, even those that detach into sessions of their own) is counted
with it. The run's timeline keeps each test phase's share (tests/timeline.py): on two cores busy
through most of the run, the CPU a test takes, more than its length, is what it costs the run.
Pods are the exception: the kubelet puts them in groups of its own, so a Kubernetes test's count
holds the cluster's components and the test's own clients, not its pods.

Needs root and cgroup v1's ``cpuacct`` hierarchy, or v2 with ``cpu`` delegated at its root;
``available()`` says whether this machine gives them. Without them, nothing is counted.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")
PREFIX = "queueplane-tests-"


def _root() -> tuple[Path, int] | None:
    """The hierarchy's root and which version it is (1 or 2), when this process may use it."""
    if os.geteuid() != 0:
        return None
    if (V1 / "cpuacct.usage").is_file():
        return V1, 1
    with contextlib.suppress(OSError):
        if "cpu" in (V2 / "cgroup.subtree_control").read_text().split():
            return V2, 2
    return None


def available() -> bool:
    return _root() is not None


class ProcessGroup:
    """One pytest process's group in a run, named ``queueplane-tests-<run>-<process>``."""

    def __init__(self, run: str, process: str):
        found = _root()
        if found is None:
            raise RuntimeError("no CPU control group this process may write to")
        self.root, self.version = found
        self.prefix = f"{PREFIX}{run}-"
        self.path = self.root / f"{self.prefix}{process}"

    def join(self) -> None:
        """This process, and so everything it starts from now on, into the group (and the groups
        of earlier runs removed, once nothing is left in them)."""
        for stale in self.root.glob(f"{PREFIX}*"):
            if not stale.name.startswith(self.prefix):
                with contextlib.suppress(OSError):
                    stale.rmdir()
        self.path.mkdir(exist_ok=True)
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_seconds(self) -> float | None:
        """CPU time of every process in the group since it was made (None if it cannot be read)."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            if self.version == 1:
                return int((self.path / "cpuacct.usage").read_text()) / 1e9
            stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return None

    def leave(self) -> None:
        """Every process still in the group (this one, and what a test left running) back to the
        root, and the group removed."""
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # ended meanwhile
                    (self.root / "cgroup.procs").write_text(pid)
            self.path.rmdir()
