"""Cost per queue: twenty queues in one worker application against one application per queue.

Every side is a `queueplane run` in local mode, as a user starts it, measured from outside
(its process tree: the driver's Python, the driver JVM, Spark's Python daemon and workers).

1. Idle memory: 20 queues of mixed group types (share, consumer, kmq) in one application, once
   every queue is ready and has settled: total RSS of the tree, its peak over a minute of
   samples (goal: at most 3 GB). Against it, one-queue applications of the same mix measured the
   same way, all running at once; 20 of them need more memory than this machine has, so 5 run
   and their total is scaled to 20 (the result says so). PSS is reported beside RSS: pages the
   forked Python workers share with their daemon count once there.
2. Idle CPU per queue: the tree's CPU time over ``--idle-seconds`` (5 minutes), per queue.
3. One busy queue among 19 idle ones keeps its throughput: steady records/s of a consumer
   queue filled while its application runs, in the 20-queue application and then alone in an
   application of its own, in one run (goal: at least 0.9).

    .venv/bin/python bench/footprint.py [--queues 20] [--separate 5] [--idle-seconds 300] [--records 200000]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from statistics import median
from typing import Any

from common import apply_queue, bench_broker, console, fill, goal, pyplot, save, steady_rate
from marks import HANDLERS, finishing_times
from sampling import CLOCK_TICKS

from queueplane.kafka.target import KafkaTarget

GOAL_MB = 3 * 1024
SETTLE_S, SAMPLE_S = 150, 60
READY_WAIT_S = 900
# The mix of idle queues, in turn; the busy one is a consumer queue of its own.
MIX = ("share", "consumer", "kmq")


def idle_queue(folder: Path, target: KafkaTarget, kind: str) -> dict:
    return apply_queue(
        folder,
        target,
        {"type": kind, "lockDuration": "30s", "maxInFlight": 500},
        topic={"partitions": 2},
        processing={"handler": "bench_handlers:trivial", "concurrency": 4},
    )


def busy_queue(folder: Path, target: KafkaTarget) -> dict:
    return apply_queue(
        folder,
        target,
        {"type": "consumer", "ordering": "partition"},
        topic={"partitions": 6},
        processing={"handler": "bench_handlers:trivial", "concurrency": 8},
    )


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class App:
    """A `queueplane run` of some specs, left running until ``stop`` (SIGTERM: it drains and ends)."""

    def __init__(self, specs: list[Path], target: KafkaTarget, folder: Path):
        self.port = _port()
        self.log = folder / f"app-{self.port}.log"
        command = [sys.executable, "-m", "queueplane", "run", *map(str, specs), "--bootstrap-servers", target.bootstrap]
        self.process = subprocess.Popen(
            [*command, "--metrics-port", str(self.port), "-o", "json"],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
            start_new_session=True,
        )

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def wait_ready(apps: list[App]) -> float:
    started = time.monotonic()
    while not all(app.ready() for app in apps):
        for app in apps:
            if app.process.poll() is not None:
                raise SystemExit(f"an application ended before it was ready: {app.log.read_text()[-2000:]}")
        if time.monotonic() - started > READY_WAIT_S:
            raise SystemExit(f"not ready within {READY_WAIT_S}s: {apps[0].log.read_text()[-2000:]}")
        time.sleep(2)
    return round(time.monotonic() - started, 1)


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "driver_python"
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"
    return "driver_jvm" if name == "java" else "python_workers"


def _kb(pid: int, path: str, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _python_kind(pid: int) -> str:
    """A Python worker's module and whether it is a daemon (the JVM's child) or forked from one."""
    try:
        command = [part for part in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if part]
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        forked = Path(f"/proc/{parent}/comm").read_text().strip() != "java"
    except (OSError, IndexError, ValueError):
        return "gone"
    return f"{command[-1] if command else '?'} ({'worker' if forked else 'process'})"


def memory(apps: list[App]) -> dict[str, Any]:
    """RSS by role and in all, and PSS in all, of every application's tree (MB); Python workers' RSS
    and count by kind."""
    out: dict[str, Any] = {
        "driver_python": 0.0,
        "driver_jvm": 0.0,
        "python_workers": 0.0,
        "rss": 0.0,
        "pss": 0.0,
        "processes": 0,
    }
    kinds: dict[str, list[float]] = {}
    for app in apps:
        for pid in _tree(app.process.pid):
            rss = _kb(pid, "status", "VmRSS:") / 1024
            role = _role(pid, app.process.pid)
            if role == "gone":
                continue
            out[role] += rss
            out["rss"] += rss
            out["processes"] += 1
            out["pss"] += _kb(pid, "smaps_rollup", "Pss:") / 1024
            if role == "python_workers":
                kind = kinds.setdefault(_python_kind(pid), [0, 0.0])
                kind[0] += 1
                kind[1] += rss
    result = {k: round(v, 1) for k, v in out.items()}
    result["python_by_kind"] = {k: {"count": n, "rss_mb": round(mb, 1)} for k, (n, mb) in sorted(kinds.items())}
    return result


def _ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def broker_pids() -> list[int]:
    """The benchmark's own broker: a JVM running ``kafka.Kafka`` below this process."""
    found = []
    for pid in _tree(os.getpid()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kafka.Kafka" in command:
            found.append(pid)
    return found


def cpu_by_role(apps: list[App]) -> dict[str, int]:
    """CPU ticks so far of each role of the applications' trees (Python workers by kind), and of the broker."""
    ticks: dict[str, int] = {}
    for app in apps:
        for pid in _tree(app.process.pid):
            role = _role(pid, app.process.pid)
            if role == "python_workers":
                role = _python_kind(pid)
            ticks[role] = ticks.get(role, 0) + _ticks(pid)
    ticks["broker_jvm"] = sum(_ticks(pid) for pid in broker_pids())
    return ticks


def machine_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the whole machine since boot (/proc/stat; guest time is in user time)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    total = sum(fields[:8])
    return total - idle, total


def idle_figures(apps: list[App], queues: int, idle_s: float) -> dict[str, Any]:
    """After settling: memory sampled for a minute (peak and median), then CPU over ``idle_s``."""
    console.print(f"settling {SETTLE_S}s, then memory for {SAMPLE_S}s and CPU for {idle_s:.0f}s")
    time.sleep(SETTLE_S)
    samples = []
    for _ in range(SAMPLE_S // 5):
        samples.append(memory(apps))
        time.sleep(5)
    peak = max(samples, key=lambda s: s["rss"])
    before, started = cpu_by_role(apps), time.monotonic()
    time.sleep(idle_s)
    after, span = cpu_by_role(apps), time.monotonic() - started
    seconds = {role: (ticks - before.get(role, 0)) / CLOCK_TICKS for role, ticks in after.items()}
    used = sum(value for role, value in seconds.items() if role != "broker_jvm")  # the applications' trees
    roles = {role: round(100 * value / span, 2) for role, value in seconds.items()}
    return {
        "queues": queues,
        "rss_mb_peak": peak["rss"],
        "rss_mb_median": round(median(s["rss"] for s in samples), 1),
        "pss_mb_peak": max(s["pss"] for s in samples),
        "by_role_mb_at_peak": {k: peak[k] for k in ("driver_jvm", "driver_python", "python_workers")},
        "processes_at_peak": peak["processes"],
        "python_by_kind_at_peak": peak["python_by_kind"],
        "idle_cpu_seconds": round(used, 1),
        "idle_window_s": round(span, 1),
        "idle_cpu_per_queue_percent_of_a_core": round(100 * used / span / queues, 3),
        # The same window by role, in % of a core, with the broker's (not in the tree) beside them.
        "idle_cpu_percent_of_a_core_by_role": dict(sorted(roles.items(), key=lambda item: -item[1])),
    }


def busy_rate(target: KafkaTarget, topic: str, records: int, marks: Path) -> dict[str, Any]:
    """Fill the busy queue while its application runs; its steady records/s once all are handled."""
    for old in marks.glob("finished-*"):
        old.unlink()
    fill(target, topic, records)
    busy_before, all_before = machine_ticks()
    deadline = time.monotonic() + 600
    while len(finishing_times(marks, "finished-[0-9]*")) < records and time.monotonic() < deadline:
        time.sleep(1)
    busy, every = (now - then for now, then in zip(machine_ticks(), (busy_before, all_before), strict=True))
    finished = finishing_times(marks, "finished-[0-9]*")
    return {
        "records": len(finished),
        "steady_records_per_s": steady_rate(finished, records),
        # How much of the machine was busy from the fill to the last record (everything on it).
        "machine_busy_share": round(busy / every, 3) if every else None,
    }


# What each process a queue keeps must import, and no more: the floor of its memory. Spark runs
# a Python streaming source's planning in a runner process per query, forks Python workers from
# a daemon per worker environment (a queue's own, so its tasks come back to its members), and a
# member is a Spark Python worker that holds a consumer in the group and a producer, returning
# its rows as Arrow.
FLOOR_PROCESSES = {
    "source_runner": "import pyspark.sql.streaming.python_streaming_source_runner",
    "daemon": "import pyspark.daemon",
    "member": (
        "import pyspark.worker, pyarrow, confluent_kafka, sys\n"
        "c = confluent_kafka.Consumer({'bootstrap.servers': sys.argv[1], 'group.id': sys.argv[2]})\n"
        "c.subscribe([sys.argv[3]])\n"
        "p = confluent_kafka.Producer({'bootstrap.servers': sys.argv[1]})\n"
        "[c.poll(0.5) for _ in range(10)]"
    ),
}


def floor(target: KafkaTarget, topic: str, queues: int) -> dict[str, Any]:
    """RSS of each process kind a queue keeps, as a bare interpreter that imports and opens only
    what that kind must (Spark's modules, pyarrow, the Kafka client), and what ``queues`` of
    each (one member per queue) come to: the memory no queueplane code is in."""
    measured: dict[str, float] = {}
    for kind, code in FLOOR_PROCESSES.items():
        body = f"{code}\nprint('ready', flush=True)\nimport time\ntime.sleep(60)"
        args = [sys.executable, "-c", body, target.bootstrap, f"floor-{kind}", topic]
        process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready", kind
            time.sleep(2)
            measured[kind] = round(_kb(process.pid, "status", "VmRSS:") / 1024, 1)
        finally:
            process.kill()
            process.wait()
    per_queue = round(sum(measured.values()), 1)
    return {"rss_mb_each": measured, "rss_mb_per_queue": per_queue, "rss_mb_queues": round(per_queue * queues, 1)}


def busy_bound(idle: dict[str, Any], alone: dict[str, Any]) -> dict[str, Any]:
    """What the idle queues leave the busy one: the machine's cores less what the idle queues,
    and the broker for them, used while idle, against the share of the machine the busy queue
    used alone. A busy queue that keeps the machine busy alone can reach at most this ratio of
    its rate alone while they use what they used idle; one that does not (1.0) is held back by
    something else than their CPU."""
    cores, queues = os.cpu_count() or 1, idle["queues"]
    # Measured with all of them idle: the busy queue's own idle part is taken off.
    idle_share = sum(idle["idle_cpu_percent_of_a_core_by_role"].values()) / 100 / cores * (queues - 1) / queues
    alone_share = alone.get("machine_busy_share") or 1.0
    return {
        "cores": cores,
        "idle_share_of_machine": round(idle_share, 3),
        "alone_share_of_machine": alone_share,
        "ratio_at_most": round(min(1.0, (1 - idle_share) / alone_share), 3),
    }


def plot(result: dict[str, Any]) -> Any:
    plt = pyplot()
    fig, (memory_ax, cpu_ax, rate_ax) = plt.subplots(1, 3, figsize=(14, 4.5))
    sides = {"one application": result["one_application"], "one per queue (scaled)": result["one_per_queue_scaled"]}
    bottom = [0.0, 0.0]
    for role in ("driver_jvm", "driver_python", "python_workers"):
        values = [side["by_role_mb_at_peak"][role] / 1024 for side in sides.values()]
        memory_ax.bar(list(sides), values, bottom=bottom, label=role.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    memory_ax.axhline(GOAL_MB / 1024, color="red", linestyle="--", label="goal: 3 GB")
    if "floor" in result:
        floor_gb = result["floor"]["rss_mb_queues"] / 1024
        memory_ax.axhline(floor_gb, color="grey", linestyle=":", label="bare processes each queue keeps")
    memory_ax.set_title(f"{result['queues']} idle queues: RSS (GB)")
    memory_ax.legend(fontsize=8)
    cpu_ax.bar(list(sides), [side["idle_cpu_per_queue_percent_of_a_core"] for side in sides.values()])
    cpu_ax.set_title("idle CPU per queue (% of a core)")
    rates = result["busy"]
    rate_ax.bar(["alone", f"among {result['queues'] - 1} idle"], [rates["alone"], rates["among_idle"]])
    bound = result.get("busy_bound", {}).get("ratio_at_most")
    if bound is not None:
        rate_ax.axhline(rates["alone"] * bound, color="grey", linestyle=":", label="what the idle queues' CPU leaves")
        rate_ax.legend(fontsize=8)
    rate_ax.set_title("busy consumer queue: steady records/s")
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=20, help="queues in the one application")
    parser.add_argument("--separate", type=int, default=5, help="one-queue applications run at once, scaled")
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    parser.add_argument("--records", type=int, default=200_000, help="records through the busy queue")
    args = parser.parse_args()

    with bench_broker("qp-bench-footprint-") as (folder, target):
        marks = folder / "marks"
        marks.mkdir()
        os.environ["QP_BENCH_MARKS"] = str(marks)  # the handler's Python workers inherit it
        (folder / "bench_handlers.py").write_text(HANDLERS)
        busy = busy_queue(folder, target)
        idle = [idle_queue(folder, target, MIX[i % len(MIX)]) for i in range(args.queues - 1)]
        specs = [busy["path"], *(q["path"] for q in idle)]
        result: dict[str, Any] = {"queues": args.queues, "mix": MIX, "records": args.records}

        result["floor"] = floor(target, busy["topic"], args.queues)
        console.print({"floor": result["floor"]})
        console.print(f"one application of {args.queues} queues")
        app = App(specs, target, folder)
        try:
            result["one_application_ready_s"] = wait_ready([app])
            result["one_application"] = idle_figures([app], args.queues, args.idle_seconds)
            console.print(result["one_application"])
            among = busy_rate(target, busy["topic"], args.records, marks)
        finally:
            app.stop()
        console.print("the busy queue alone")
        alone_app = App([busy["path"]], target, folder)
        try:
            wait_ready([alone_app])
            alone = busy_rate(target, busy["topic"], args.records, marks)
        finally:
            alone_app.stop()
        result["busy"] = {"among_idle": among["steady_records_per_s"], "alone": alone["steady_records_per_s"]}
        result["busy_machine_share"] = {"among_idle": among["machine_busy_share"], "alone": alone["machine_busy_share"]}
        result["busy_bound"] = busy_bound(result["one_application"], alone)
        console.print(result["busy"])

        console.print(f"{args.separate} one-queue applications at once")
        separate = [App([spec], target, folder) for spec in specs[: args.separate]]
        try:
            result["one_per_queue_ready_s"] = wait_ready(separate)
            measured = idle_figures(separate, args.separate, args.idle_seconds)
        finally:
            for one in separate:
                one.stop()
        scale = args.queues / args.separate
        result["one_per_queue_measured"] = measured
        # What 20 one-queue applications would hold: the memory of 5 times four; CPU per queue as measured.
        result["one_per_queue_scaled"] = {
            "queues": args.queues,
            "scaled_from": args.separate,
            "rss_mb_peak": round(measured["rss_mb_peak"] * scale, 1),
            "pss_mb_peak": round(measured["pss_mb_peak"] * scale, 1),
            "by_role_mb_at_peak": {k: round(v * scale, 1) for k, v in measured["by_role_mb_at_peak"].items()},
            "idle_cpu_per_queue_percent_of_a_core": measured["idle_cpu_per_queue_percent_of_a_core"],
        }
        one = result["one_application"]
        result["goals"] = [
            goal(f"{args.queues} idle queues in one application: RSS / 3 GB", one["rss_mb_peak"], GOAL_MB, at_most=1.0),
            goal(
                f"busy consumer queue among {args.queues - 1} idle / alone",
                result["busy"]["among_idle"],
                result["busy"]["alone"],
                at_least=0.9,
            ),
        ]
        result["against_one_application_per_queue"] = round(
            one["rss_mb_peak"] / result["one_per_queue_scaled"]["rss_mb_peak"], 3
        )
        save("footprint", result, plot(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
