"""kmq worker benchmark: what the markers and the tracker cost next to a plain consumer group.

1. Trivial handler, same broker, same run, same partitions, records and concurrency: steady
   records/s of a kmq queue as a ratio to a consumer-group queue (goal >= 0.7).
2. Marker bytes per message: key and value bytes written to the markers topic per message
   (a start and an end marker each; Kafka adds its per-record overhead on top).

    .venv/bin/python bench/kmq.py [--records 20000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import yaml
from rich.console import Console
from share import HANDLERS, fill, worker_throughput

from queueplane import workflow
from queueplane.connection import KafkaTarget
from queueplane.local.stack import LocalStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from worker_support import read_all

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 6
console = Console(stderr=True)


def make_spec(folder: Path, target: KafkaTarget, group_type: str, concurrency: int) -> dict:
    tag = uuid.uuid4().hex[:6]
    group = {"type": group_type, "id": f"bench-{tag}", "lockDuration": "30s", "maxInFlight": 2000}
    doc = {
        "apiVersion": "queueplane.io/v1",
        "kind": "Queue",
        "metadata": {"name": f"bench-{group_type}-{tag}", "team": "bench"},
        "spec": {
            "topic": {"name": f"bench.{tag}", "partitions": PARTITIONS},
            "group": group,
            "processing": {"handler": "bench_handlers:trivial", "concurrency": concurrency},
        },
    }
    path = folder / f"bench-{tag}.yaml"
    path.write_text(yaml.safe_dump(doc))
    workflow.apply(workflow.plan([str(path)], target))
    return {"path": path, "topic": doc["spec"]["topic"]["name"]}


def marker_bytes(target: KafkaTarget, topic: str, records: int) -> dict:
    markers = read_all(target, topic, expect_at_least=2 * records, timeout_s=120)
    payload = sum(len(m.key() or b"") + len(m.value() or b"") for m in markers)
    return {
        "markers": len(markers),
        "markers_per_message": round(len(markers) / records, 3),
        "payload_bytes_per_message": round(payload / records, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    result: dict = {"records": args.records, "partitions": PARTITIONS, "goal": "kmq / consumer >= 0.7"}
    with tempfile.TemporaryDirectory(prefix="qp-bench-kmq-") as tmp:
        os.environ["QUEUEPLANE_HOME"] = tmp
        folder = Path(tmp)
        marks = folder / "marks"
        marks.mkdir()
        os.environ["QP_BENCH_FIRST_CALLS"] = str(marks)
        (folder / "bench_handlers.py").write_text(HANDLERS)
        stack = LocalStack(folder / "local")
        with console.status("starting a local Kafka broker for the benchmark"):
            state = stack.up()
        target = KafkaTarget({"bootstrap.servers": state.bootstrap}, state.bootstrap)
        try:
            for group_type in ("consumer", "kmq"):
                spec = make_spec(folder, target, group_type, args.concurrency)
                fill(target, spec["topic"], args.records)
                console.print(f"trivial handler, {group_type} group, concurrency {args.concurrency}")
                result[group_type] = worker_throughput(spec["path"], target, args.records, marks)
                console.print(result[group_type])
                if group_type == "kmq":
                    result["marker_bytes"] = marker_bytes(target, f"{spec['topic']}.markers", args.records)
        finally:
            stack.down(purge=True)
    result["ratio"] = round(result["kmq"]["steady_records_per_s"] / result["consumer"]["steady_records_per_s"], 3)
    (RESULTS / "kmq.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result)
    print(json.dumps(result, indent=2))
    return 0


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rates = [result["consumer"]["steady_records_per_s"], result["kmq"]["steady_records_per_s"]]
    left.bar(["consumer group", "kmq"], rates, color=["#c44e52", "#4c72b0"])
    left.set_ylabel("records/s")
    left.set_title(f"trivial handler, {result['partitions']} partitions: ratio {result['ratio']:.2f} (goal >= 0.7)")
    m = result["marker_bytes"]
    right.bar(["key + value"], [m["payload_bytes_per_message"]], color="#55a868")
    right.set_ylabel("marker bytes per message")
    right.set_title(f"markers topic ({m['markers_per_message']:.2f} markers per message)")
    fig.tight_layout()
    fig.savefig(RESULTS / "kmq.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
