"""Soak: a share and a consumer queue under a steady load for a long run, side by side.

Each worker gets a steady rate of orders (1% poison, 2% slow) from its own producer thread.
Every 10 s the benchmark samples each worker's memory (RSS of the driver, its JVM and its
Python workers together), its rate and its lag from the worker's metrics endpoint. At the
end the producers stop, the workers work off what is left, and every produced order must
be in the output topic or the DLQ. Memory must grow less than 10% over the last two thirds
of the run (the first third is warm-up: the JVM sizes its heap, Python workers start).

    .venv/bin/python bench/soak.py [--minutes 30] [--rate 100]

It runs in `make bench` only; the run fails when a record is lost or memory grows past the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import psutil
from common import apply_queue, bench_broker, console, goal, pyplot, save

from queueplane.kafka import clients
from queueplane.kafka.target import KafkaTarget
from queueplane.local.processes import free_port
from queueplane.ops.load import ID_HEADER, QUEUE_PRODUCER, make_order

REPO = Path(__file__).resolve().parent.parent
HANDLERS = REPO / "specs" / "examples" / "cafe"
SAMPLE_S = 10.0
POISON_RATE, SLOW_RATE = 0.01, 0.02
MAX_GROWTH = 0.10
TAIL_S = 60.0  # after the load stops: time for the workers to work off what is left


@dataclass
class Soaked:
    """One queue's run: what was produced and the samples taken while it ran."""

    group: str
    names: dict[str, Any]
    port: int  # the worker's metrics endpoint
    produced: list[str] = field(default_factory=list)
    samples: list[dict[str, float]] = field(default_factory=list)
    process: Any = None


def _produce_steadily(target: KafkaTarget, soaked: Soaked, rate: float, until: float) -> None:
    """``rate`` orders a second until ``until`` (monotonic), in ticks of a tenth of a second."""
    producer = clients.producer(target.settings, {**QUEUE_PRODUCER, "enable.idempotence": True})
    rng = random.Random(hash(soaked.group) & 0xFFFF)
    started, sent = time.monotonic(), 0
    while time.monotonic() < until:
        due = int((time.monotonic() - started) * rate)
        for index in range(sent, due):
            order_id, key, value = make_order(index, 64, rng, rng.random() < SLOW_RATE, f"{soaked.group}-")
            if rng.random() < POISON_RATE:
                value = value[: len(value) // 2]
            producer.produce(soaked.names["topic"], key=key, value=value, headers=[(ID_HEADER, order_id.encode())])
            soaked.produced.append(order_id)
        sent = due
        producer.poll(0)
        time.sleep(0.1)
    if producer.flush(60):
        raise RuntimeError(f"{soaked.group}: records not delivered")


def _metrics(port: int) -> dict[str, float]:
    """The worker's records (all outcomes) and backlog, summed over labels."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {"records": 0.0, "backlog": 0.0}
    for line in text.splitlines():
        if line.startswith("queueplane_records_total{"):
            out["records"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("queueplane_backlog_records{"):
            out["backlog"] += float(line.rsplit(" ", 1)[1])
    return out


def _rss_mib(pid: int) -> dict[str, float]:
    """RSS of a worker: all of it (the CLI's Python driver, its JVM, Spark's Python workers),
    and the Python processes alone, where the runtimes' own objects live."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {"rss_mib": 0.0, "python_mib": 0.0}
    total = python = 0
    for proc in procs:
        try:
            rss = proc.memory_info().rss
            total += rss
            python += rss if proc.name().startswith("python") else 0
        except psutil.NoSuchProcess:
            continue
    return {"rss_mib": total / 2**20, "python_mib": python / 2**20}


def _sample(soaked: Soaked, started: float) -> None:
    try:
        metrics = _metrics(soaked.port)
    except OSError:
        return  # not serving yet
    soaked.samples.append({"t": time.monotonic() - started, **_rss_mib(soaked.process.pid), **metrics})


def growth(samples: list[dict[str, float]], duration_s: float, key: str = "rss_mib") -> float:
    """Growth of ``key`` over the last two thirds of the load: the mean of the last three samples
    against the mean of the first three of that window."""
    window = [s[key] for s in samples if duration_s / 3 <= s["t"] <= duration_s]
    if len(window) < 6:
        raise RuntimeError(f"too few samples ({len(window)}) in the measured window")
    first, last = sum(window[:3]) / 3, sum(window[-3:]) / 3
    return (last - first) / first


# A line of the JVM's ``-Xlog:gc`` with uptime: its heap before and after the pause, and committed.
_GC_LINE = re.compile(r"^\[(?P<t>[0-9.]+)s\].* (?P<before>\d+)M->(?P<after>\d+)M\((?P<committed>\d+)M\)")


def jvm_heap(gc_log: Path, duration_s: float) -> dict[str, float] | None:
    """The driver JVM's heap over the window of ``growth`` (its uptime stands for the run's time:
    the JVM starts seconds after the worker): the least left after a collection in the window's
    first and last fifth (the live objects, where a leak would show), and the heap committed
    at its start and end (what the JVM took from the machine; its RSS follows)."""
    if not gc_log.exists():
        return None
    pauses = [
        (float(m["t"]), int(m["after"]), int(m["committed"]))
        for m in map(_GC_LINE.match, gc_log.read_text(errors="replace").splitlines())
        if m
    ]
    window = [p for p in pauses if duration_s / 3 <= p[0] <= duration_s]
    if len(window) < 2:
        return None
    fifth = (duration_s - duration_s / 3) / 5
    early = [p for p in window if p[0] <= duration_s / 3 + fifth] or window[:1]
    late = [p for p in window if p[0] >= duration_s - fifth] or window[-1:]
    return {
        "live_mib_first": min(p[1] for p in early),
        "live_mib_last": min(p[1] for p in late),
        "committed_mib_first": window[0][2],
        "committed_mib_last": window[-1][2],
        "collections": len(window),
    }


def _ended_ids(target: KafkaTarget, topics: list[str], expect: int) -> set[str]:
    """Order ids found in the topics: the output's ``id`` field, the DLQ's id header."""
    consumer = clients.consumer(
        target.settings, {"group.id": f"soak-check-{time.time_ns()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe(topics)
    found: set[str] = set()
    quiet_since = time.monotonic()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (len(found) < expect or time.monotonic() - quiet_since < 3):
        batch = [m for m in consumer.consume(1000, 0.5) if not m.error()]
        if batch:
            quiet_since = time.monotonic()
        for message in batch:
            header = dict(message.headers() or []).get(ID_HEADER)
            if header is not None and message.topic().endswith(".dlq"):
                found.add(header.decode())
            else:
                found.add(json.loads(message.value())["id"])
    consumer.close()
    return found


def run_soak(minutes: float, rate: float, folder: Path, target: KafkaTarget, tail_s: float = TAIL_S) -> dict[str, Any]:
    """Both queues side by side for ``minutes`` of load; the figures and the samples."""
    shutil.copytree(HANDLERS, folder / "cafe")
    processing = {"handler": "cafe.handlers:prepare_drink", "concurrency": 8}
    groups = {"share": {"type": "share", "lockDuration": "15s"}, "consumer": {"type": "consumer", "ordering": "key"}}
    queues = [
        Soaked(name, apply_queue(folder, target, group, True, processing=processing), free_port("127.0.0.1"))
        for name, group in groups.items()
    ]
    duration = minutes * 60
    started = time.monotonic()
    load_ends = started + duration
    for soaked in queues:
        command = [sys.executable, "-m", "queueplane", "run", str(soaked.names["path"]), "-o", "json"]
        command += ["--bootstrap-servers", target.bootstrap, "--metrics-port", str(soaked.port)]
        command += ["--max-duration", f"{int(duration + tail_s)}s"]
        # The driver JVM logs each collection: the heap it keeps apart from what it committed.
        gc_log = f"-Xlog:gc:file={folder / f'{soaked.group}-gc.log'}:uptime"
        java_options = " ".join(filter(None, [os.environ.get("JAVA_TOOL_OPTIONS"), gc_log]))
        soaked.process = subprocess.Popen(
            command,
            cwd=folder,
            env={**os.environ, "JAVA_TOOL_OPTIONS": java_options},
            stdout=subprocess.PIPE,
            stderr=(folder / f"{soaked.group}.log").open("w"),
            text=True,
        )
    producers = [
        threading.Thread(target=_produce_steadily, args=(target, s, rate, load_ends), daemon=True) for s in queues
    ]
    for thread in producers:
        thread.start()
    with console.status("soaking") as status:
        while any(s.process.poll() is None for s in queues):
            for soaked in queues:
                if soaked.process.poll() is None:
                    _sample(soaked, started)
            last = {s.group: s.samples[-1] for s in queues if s.samples}
            status.update(
                f"soaking: {time.monotonic() - started:.0f}s of {duration + tail_s:.0f}s; "
                + ", ".join(f"{g} {v['rss_mib']:.0f} MiB, backlog {v['backlog']:.0f}" for g, v in last.items())
            )
            time.sleep(SAMPLE_S)
    for thread in producers:
        thread.join()
    result: dict[str, Any] = {"minutes": minutes, "rate_per_queue": rate, "queues": {}}
    for soaked in queues:
        summary = json.loads(soaked.process.stdout.read() or "{}")
        ended = _ended_ids(target, [soaked.names["output"], f"{soaked.names['topic']}.dlq"], len(soaked.produced))
        missing = set(soaked.produced) - ended
        rss = [s["rss_mib"] for s in soaked.samples]
        result["queues"][soaked.group] = {
            "produced": len(soaked.produced),
            "lost": len(missing),
            "lost_examples": sorted(missing)[:5],
            "counts": summary.get("counts"),
            "rss_mib_first_last_max": [round(rss[0]), round(rss[-1]), round(max(rss))] if rss else None,
            "rss_growth_last_two_thirds": round(growth(soaked.samples, duration), 4),
            "python_rss_growth_last_two_thirds": round(growth(soaked.samples, duration, "python_mib"), 4),
            "driver_jvm_heap": jvm_heap(folder / f"{soaked.group}-gc.log", duration),
            "samples": soaked.samples,
        }
    result["max_growth"] = MAX_GROWTH
    result["goals"] = [
        g
        for group, q in result["queues"].items()
        for g in (
            goal(f"soak, {group}: records lost / produced", q["lost"], q["produced"], at_most=0.0),
            goal(
                f"soak, {group}: RSS growth over the last two thirds",
                q["rss_growth_last_two_thirds"],
                1.0,
                at_most=MAX_GROWTH,
            ),
        )
    ]
    result["met"] = all(
        q["lost"] == 0 and q["rss_growth_last_two_thirds"] < MAX_GROWTH for q in result["queues"].values()
    )
    return result


def plot(result: dict[str, Any]) -> Any:
    plt = pyplot()
    fig, (rss_ax, rate_ax, lag_ax) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for group, figures in result["queues"].items():
        samples = figures["samples"]
        minutes = [s["t"] / 60 for s in samples]
        rss_ax.plot(minutes, [s["rss_mib"] for s in samples], label=f"{group}: all")
        if "python_mib" in samples[0]:
            rss_ax.plot(minutes, [s["python_mib"] for s in samples], linestyle="--", label=f"{group}: Python")
        rates = [0.0] + [(b["records"] - a["records"]) / max(b["t"] - a["t"], 1e-9) for a, b in pairwise(samples)]
        rate_ax.plot(minutes, rates, label=group)
        lag_ax.plot(minutes, [s["backlog"] for s in samples], label=group)
    load_minutes = result["minutes"]
    for ax in (rss_ax, rate_ax, lag_ax):
        ax.axvline(load_minutes / 3, color="grey", linestyle=":", linewidth=0.8)
        ax.axvline(load_minutes, color="grey", linestyle="--", linewidth=0.8)
        ax.legend(loc="upper left")
    rss_ax.set_ylabel("worker RSS (MiB)")
    rate_ax.set_ylabel("records/s")
    lag_ax.set_ylabel("backlog (records)")
    lag_ax.set_xlabel("minutes (dotted: growth window starts; dashed: load stops)")
    fig.suptitle(f"soak: {result['rate_per_queue']:g} records/s per queue, 1% poison, 2% slow")
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0, help="records/s per queue")
    args = parser.parse_args()
    with bench_broker("queueplane-soak-") as (folder, target):
        result = run_soak(args.minutes, args.rate, folder, target)
    samples = {g: q.pop("samples") for g, q in result["queues"].items()}
    figure = plot({**result, "queues": {g: {**q, "samples": samples[g]} for g, q in result["queues"].items()}})
    save("soak", result, figure)
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
