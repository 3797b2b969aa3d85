"""The test suite's timeline: what each pytest process ran when, and where the run's time went.

`make test` records it (tests/timeline.py) in ``.queueplane/test-timeline.jsonl``; this prints
the run's span, each process's busy time, the heavy tests' total (they run alone, or paired:
the other processes wait meanwhile) and their waits for the lock, how busy the machine's cores
were while light tests ran and while each heavy test ran (where the run recorded the machine's
CPU time), the slowest tests and those that took the most CPU (where the run counted it:
tests/cpu_accounting.py), and draws ``bench/results/test-timeline.png``.

    .venv/bin/python bench/test_timeline.py [.queueplane/test-timeline.jsonl]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from common import pyplot, save

DEFAULT = Path(__file__).resolve().parents[1] / ".queueplane" / "test-timeline.jsonl"
SHOWN = 25  # the slowest tests listed
LABELLED_S = 90.0  # tests at least this long get their name on the plot


@dataclass
class Test:
    name: str
    process: str
    heavy: bool
    start: float = float("inf")
    stop: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    cpu_s: float | None = None  # its process's CPU time over its phases, where the run counted it
    lock_at: float | None = None  # when it got the run's lock (tests/run_lock.py), where recorded
    lock_wait_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.stop - self.start

    @property
    def held_from(self) -> float:
        """When it had the machine: a heavy test's set-up includes its wait for the others to end."""
        return self.lock_at if self.lock_at is not None else self.start


@dataclass(frozen=True)
class Tick:
    """The machine's CPU time, busy and in all (clock ticks), as a phase's report came in."""

    at: float
    busy: int
    total: int


def load(path: Path) -> tuple[list[Test], list[Tick]]:
    tests: dict[str, Test] = {}
    ticks: list[Tick] = []
    for line in path.read_text().splitlines():
        phase = json.loads(line)
        if phase.get("machine"):
            ticks.append(Tick(phase["stop"], *phase["machine"]))
        test = tests.setdefault(phase["test"], Test(phase["test"], phase["process"], phase["heavy"]))
        test.start, test.stop = min(test.start, phase["start"]), max(test.stop, phase["stop"])
        test.phases[phase["phase"]] = round(phase["stop"] - phase["start"], 1)
        if phase.get("cpu_s") is not None:
            test.cpu_s = (test.cpu_s or 0.0) + phase["cpu_s"]
        if phase.get("run_lock"):
            test.lock_at, test.lock_wait_s = phase["run_lock"]["at"], phase["run_lock"]["waited_s"]
    return sorted(tests.values(), key=lambda t: t.start), sorted(ticks, key=lambda t: t.at)


def machine_busy(tests: list[Test], ticks: list[Tick]) -> dict[str, dict[str, float]]:
    """How busy the cores were (busy ticks over all ticks) between consecutive reports, summed by
    what ran: ``light`` while no heavy test did, else the heavy test's file. Light tests wait for
    locks, idle windows and outages: what is idle here is what more processes could use."""
    spans: dict[str, list[float]] = {}
    heavy = [t for t in tests if t.heavy]
    for before, after in pairwise(ticks):
        if after.total <= before.total:
            continue
        middle = (before.at + after.at) / 2
        running = sorted(_file(t) for t in heavy if t.held_from <= middle <= t.stop)
        name = " + ".join(running) if running else "light"
        span = spans.setdefault(name, [0.0, 0, 0])
        span[0] += after.at - before.at
        span[1] += after.busy - before.busy
        span[2] += after.total - before.total
    return {name: {"seconds": round(s), "busy": round(busy / total, 2)} for name, (s, busy, total) in spans.items()}


def _file(test: Test) -> str:
    return test.name.split("::", 1)[0].rsplit("/", 1)[-1]


def heavy_seconds(tests: list[Test]) -> float:
    """How long heavy tests held the machine: paired ones overlap, so their spans are joined."""
    spans = sorted((t.held_from, t.stop) for t in tests if t.heavy)
    total, reach = 0.0, float("-inf")
    for start, stop in spans:
        total += max(0.0, stop - max(start, reach))
        reach = max(reach, stop)
    return total


def _cpu_total(tests: list[Test]) -> int | None:
    """The CPU seconds of ``tests``, or None where the run counted none of it."""
    counted = [t.cpu_s for t in tests if t.cpu_s is not None]
    return round(sum(counted)) if counted else None


def _by_minute(ticks: list[Tick]) -> list[tuple[float, float]]:
    """(middle of the window, busy share) over windows of at least a minute between reports."""
    points, first = [], ticks[0]
    for tick in ticks[1:]:
        if tick.at - first.at >= 60 and tick.total > first.total:
            points.append(((first.at + tick.at) / 2, (tick.busy - first.busy) / (tick.total - first.total)))
            first = tick
    return points


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not path.is_file():
        print(f"{path}: no timeline (`make test` records one)", file=sys.stderr)
        return 1
    tests, ticks = load(path)
    began = min(t.start for t in tests)
    span = max(t.stop for t in tests) - began
    processes = sorted({t.process for t in tests})
    result = {
        "span_s": round(span),
        "tests": len(tests),
        "processes": {
            p: {
                "busy_s": round(sum(t.seconds for t in tests if t.process == p)),
                "last_stop_s": round(max(t.stop for t in tests if t.process == p) - began),
                "cpu_s": _cpu_total([t for t in tests if t.process == p]),
            }
            for p in processes
        },
        "heavy_s": round(heavy_seconds(tests)),
        # What the heavy tests waited for the lock: light tests ending (idle cores) or another heavy test.
        "heavy_waits_s": round(sum(t.lock_wait_s for t in tests if t.heavy)),
        "machine_busy": machine_busy(tests, ticks) if len(ticks) > 1 else None,
        "slowest": [
            {"test": t.name, "process": t.process, "heavy": t.heavy, "at_s": round(t.start - began), **t.phases}
            for t in sorted(tests, key=lambda t: -t.seconds)[:SHOWN]
        ],
        # What each test cost the machine, except the CPU of pods it had the cluster run.
        "most_cpu": [
            {"test": t.name, "cpu_s": round(t.cpu_s or 0.0), "seconds": round(t.seconds)}
            for t in sorted((t for t in tests if t.cpu_s), key=lambda t: -(t.cpu_s or 0.0))[:SHOWN]
        ],
    }
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(14, 1.6 + 1.2 * len(processes)))
    for row, process in enumerate(processes):
        for t in (t for t in tests if t.process == process):
            axes.barh(
                row, t.seconds, left=t.start - began, color="tab:red" if t.heavy else "tab:blue", edgecolor="white"
            )
            if t.seconds >= LABELLED_S:
                label = t.name.rsplit("/", 1)[-1].split("[", 1)[0][:40]
                axes.text(t.start - began + 2, row, label, fontsize=6, rotation=90, va="center")
    for t in (t for t in tests if t.heavy):  # the other processes' bars meanwhile are waits for the lock
        axes.axvspan(t.held_from - began, t.stop - began, color="tab:red", alpha=0.12, linewidth=0)
    if len(ticks) > 1:  # the cores' busy share over each minute, on the same time axis
        busy = axes.twinx()
        minutes = _by_minute(ticks)
        busy.plot([at - began for at, _ in minutes], [share * 100 for _, share in minutes], color="black", linewidth=1)
        busy.set_ylim(0, 100)
        busy.set_ylabel("machine busy, % (black)")
    axes.set_yticks(range(len(processes)), processes)
    axes.set_xlabel("seconds since the first test (red: heavy, run alone)")
    axes.set_title(f"test suite timeline: {len(tests)} tests in {span / 60:.1f} min")
    save("test-timeline", result, figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
