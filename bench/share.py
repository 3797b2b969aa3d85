"""Share-group worker benchmark: the Spark worker against ideals and a plain client loop.

1. Handler sleeping 10 ms, 6 partitions, 20k records, slots 6/24/48: steady throughput as a
   ratio to the ideal slots / 10 ms (goal >= 0.85 at 48 slots).
2. Trivial handler: records/s as a ratio to a plain confluent-kafka ShareConsumer loop with
   the same slots, on the same broker, in the same run (goal >= 0.7).
3. Peak RSS of the driver (Python and JVM) and of the Python workers.

    .venv/bin/python bench/share.py [--records 20000] [--slots 6,24,48]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import yaml
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from rich.console import Console

from queueplane import workflow
from queueplane.cluster import quiet_logger
from queueplane.connection import KafkaTarget
from queueplane.lag import queue_backlog
from queueplane.load import QUEUE_PRODUCER
from queueplane.local.stack import LocalStack
from queueplane.worker.runner import RunOptions, run_queue

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 6
console = Console(stderr=True)

HANDLERS = """
import atexit
import os
import time

_MARKS = os.environ.get("QP_BENCH_MARKS", "/tmp")
_first = []  # this process's first call
_last = [0.0, 0.0]  # last call's end, last time it was written


def _write(kind, value):
    with open(os.path.join(_MARKS, f"{kind}-{os.getpid()}"), "w") as handle:
        handle.write(repr(value))


def _mark_first():
    # Once per process, checked in memory: the handler must cost next to nothing per call.
    if not _first:
        _first.append(time.time())
        _write("first", _first[0])


def _mark_last():
    now = time.time()
    _last[0] = now
    if now - _last[1] > 0.05:
        _last[1] = now
        _write("last", now)


atexit.register(lambda: _last[0] and _write("last", _last[0]))


def sleep_10ms(record):
    _mark_first()
    time.sleep(0.010)
    _mark_last()


def trivial(record):
    _mark_first()
    _mark_last()
    return None
"""


class RssSampler:
    """Peak resident memory of this process, its JVM child and the Spark Python workers."""

    def __init__(self) -> None:
        self.peak = {"driver_python_mb": 0.0, "driver_jvm_mb": 0.0, "python_workers_mb": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _processes() -> list[tuple[int, int, str, float]]:
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                rss = (
                    next(
                        int(line.split()[1])
                        for line in (entry / "status").read_text().splitlines()
                        if line.startswith("VmRSS:")
                    )
                    / 1024
                )
            except (OSError, StopIteration, ValueError, IndexError):
                continue
            out.append((int(entry.name), ppid, cmd, rss))
        return out

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            procs = self._processes()
            children: dict[int, list[int]] = {}
            for pid, ppid, _, _ in procs:
                children.setdefault(ppid, []).append(pid)
            tree, todo = set(), [me]
            while todo:
                pid = todo.pop()
                tree.add(pid)
                todo.extend(children.get(pid, []))
            workers = jvm = python = 0.0
            for pid, _, cmd, rss in procs:
                if pid not in tree:
                    continue
                if pid == me:
                    python = rss
                elif "java" in cmd.split(" ")[0]:
                    jvm += rss
                elif "pyspark" in cmd or "daemon" in cmd or "worker" in cmd or "python" in cmd:
                    workers += rss
            for key, value in (("driver_python_mb", python), ("driver_jvm_mb", jvm), ("python_workers_mb", workers)):
                self.peak[key] = max(self.peak[key], round(value, 1))
            time.sleep(0.5)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def make_spec(folder: Path, target: KafkaTarget, handler: str, slots: int) -> Path:
    tag = uuid.uuid4().hex[:6]
    doc = {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": f"bench-{tag}", "team": "bench"},
        "spec": {
            "topic": {"name": f"bench.{tag}", "partitions": PARTITIONS},
            # maxInFlight bounds what one poll can acquire (librdkafka's max.poll.records is best-effort):
            # sized so the slots can start every acquired record well within the lock.
            "group": {"type": "share", "id": f"bench-{tag}", "lockDuration": "15s", "maxInFlight": 200},
            "processing": {"handler": f"bench_handlers:{handler}", "concurrency": slots},
        },
    }
    path = folder / f"bench-{tag}.yaml"
    path.write_text(yaml.safe_dump(doc))
    workflow.apply(workflow.plan([str(path)], target))
    return path


def fill(target: KafkaTarget, topic: str, count: int) -> None:
    producer = Producer({**target.settings, **QUEUE_PRODUCER, "logger": quiet_logger()})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=str(i % 64).encode(), value=b'{"id": %d}' % i)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def worker_throughput(spec: Path, target: KafkaTarget, records: int, marks_dir: Path) -> dict:
    """Records/s from the first handler call to the end of the last: Spark and group start-up and the
    shutdown excluded (the handlers mark both ends; Python workers write the last mark on exit)."""
    (queue,) = workflow.validate([str(spec)], target)
    for old in marks_dir.glob("*-*"):
        old.unlink()
    summary = run_queue(
        queue,
        target,
        RunOptions(max_records=records),
        backlog=queue_backlog(target, queue),
    )
    first = min(float(p.read_text()) for p in marks_dir.glob("first-*"))
    ended = max(float(p.read_text()) for p in marks_dir.glob("last-*"))
    done = summary.counts.get("accepted", 0) + summary.counts.get("dlq", 0)
    return {"records": done, "steady_records_per_s": round(done / (ended - first), 1), "counts": summary.counts}


def plain_loop_throughput(target: KafkaTarget, topic: str, group: str, slots: int, records: int) -> float:
    """The baseline: ``slots`` threads, each a ShareConsumer polling and ACCEPTing, nothing else."""
    done = 0
    lock = threading.Lock()
    first: list[float] = []
    stop = threading.Event()

    def loop(i: int) -> None:
        nonlocal done
        consumer = ShareConsumer(
            {
                **target.settings,
                "group.id": group,
                "share.acknowledgement.mode": "explicit",
                "logger": quiet_logger(),
                "client.id": f"plain-{i}",
            }
        )
        consumer.subscribe([topic])
        while not stop.is_set():
            messages = consumer.poll(0.2)
            for m in messages:
                if not m.error():
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            if messages:
                consumer.commit_sync()  # counted once the broker has the acknowledgements, as in the worker
                with lock:
                    if not first:
                        first.append(time.monotonic())
                    done += len(messages)
                    if done >= records:
                        stop.set()
        consumer.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(slots)]
    for t in threads:
        t.start()
    stop.wait(300)
    end = time.monotonic()
    stop.set()
    for t in threads:
        t.join()
    return round(done / (end - first[0]), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--slots", default="6,24,48")
    args = parser.parse_args()
    slot_counts = [int(s) for s in args.slots.split(",")]
    RESULTS.mkdir(exist_ok=True)
    result: dict = {
        "records": args.records,
        "partitions": PARTITIONS,
        "sleep_10ms": {},
        "goals": {"ratio_to_ideal_at_48": ">= 0.85", "trivial_ratio_to_plain_loop": ">= 0.7"},
    }
    with tempfile.TemporaryDirectory(prefix="qp-bench-share-") as tmp:
        os.environ["QUEUEPLANE_HOME"] = tmp
        folder = Path(tmp)
        marks = folder / "marks"
        marks.mkdir()
        os.environ["QP_BENCH_MARKS"] = str(marks)
        (folder / "bench_handlers.py").write_text(HANDLERS)
        stack = LocalStack(folder / "local")
        with console.status("starting a local Kafka broker for the benchmark"):
            state = stack.up()
        target = KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
        try:
            with RssSampler() as rss:
                for slots in slot_counts:
                    spec = make_spec(folder, target, "sleep_10ms", slots)
                    fill(target, yaml.safe_load(spec.read_text())["spec"]["topic"]["name"], args.records)
                    console.print(f"sleep 10ms handler, {slots} slots")
                    measured = worker_throughput(spec, target, args.records, marks)
                    ideal = slots / 0.010
                    measured["ideal_records_per_s"] = ideal
                    measured["ratio_to_ideal"] = round(measured["steady_records_per_s"] / ideal, 3)
                    result["sleep_10ms"][str(slots)] = measured
                    console.print(measured)
                slots = slot_counts[-1]
                spec = make_spec(folder, target, "trivial", slots)
                topic = yaml.safe_load(spec.read_text())["spec"]["topic"]["name"]
                fill(target, topic, args.records)
                console.print(f"trivial handler, {slots} slots")
                trivial = worker_throughput(spec, target, args.records, marks)
            plain_topic_spec = make_spec(folder, target, "trivial", slots)
            doc = yaml.safe_load(plain_topic_spec.read_text())["spec"]
            fill(target, doc["topic"]["name"], args.records)
            console.print(f"plain ShareConsumer loop, {slots} consumers")
            plain = plain_loop_throughput(target, doc["topic"]["name"], doc["group"]["id"], slots, args.records)
            result["trivial"] = {
                "slots": slots,
                "worker_records_per_s": trivial["steady_records_per_s"],
                "plain_loop_records_per_s": plain,
                "ratio": round(trivial["steady_records_per_s"] / plain, 3),
            }
            result["peak_rss"] = rss.peak
        finally:
            stack.down(purge=True)
    (RESULTS / "share.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result)
    print(json.dumps(result, indent=2))
    return 0


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    slots = list(result["sleep_10ms"])
    measured = [result["sleep_10ms"][s]["steady_records_per_s"] for s in slots]
    ideal = [result["sleep_10ms"][s]["ideal_records_per_s"] for s in slots]
    x = range(len(slots))
    left.bar([i - 0.2 for i in x], ideal, width=0.4, label="ideal (slots / 10 ms)", color="#cccccc")
    left.bar([i + 0.2 for i in x], measured, width=0.4, label="worker", color="#4c72b0")
    for i, s in enumerate(slots):
        left.text(i + 0.2, measured[i], f"{result['sleep_10ms'][s]['ratio_to_ideal']:.2f}", ha="center", va="bottom")
    left.set_xticks(list(x), [f"{s} slots" for s in slots])
    left.set_ylabel("records/s")
    left.set_title(f"10 ms handler, {result['partitions']} partitions")
    left.legend()
    t = result["trivial"]
    right.bar(
        ["plain ShareConsumer loop", "queueplane worker"],
        [t["plain_loop_records_per_s"], t["worker_records_per_s"]],
        color=["#c44e52", "#4c72b0"],
    )
    right.set_ylabel("records/s")
    right.set_title(f"trivial handler, {t['slots']} slots: ratio {t['ratio']:.2f} (goal >= 0.7)")
    fig.tight_layout()
    fig.savefig(RESULTS / "share.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
