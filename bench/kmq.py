"""kmq worker benchmark: what the markers and the tracker cost next to a plain consumer group.

1. Trivial handler, same broker, same run, same partitions, records, concurrency and records per
   micro-batch: steady records/s of a kmq queue as a ratio to a consumer-group queue (goal >=
   0.85). A warm-up run of each side first, then ``--rounds`` rounds that swap which side goes
   first; each side's best counts. Each counted run spans several micro-batches on both sides,
   so what a batch costs beyond its records counts on both.
2. Marker bytes per message: key and value bytes written to the markers topic per message
   (a start and an end marker each; Kafka adds its per-record overhead on top).
3. CPU seconds per 100k records of each counted run, by process (broker JVM, Spark's JVM, the
   Python workers, this process with the driver), read from /proc. While both sides keep the
   machine's cores busy, throughput follows the total, so the totals' ratio bounds the goal's
   ratio, and the roles say where kmq's extra CPU goes.

    .venv/bin/python bench/kmq.py [--records 200000] [--concurrency 16] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from common import SPARK_BATCH_RECORDS, apply_queue, bench_broker, console, fill, goal, profiled, pyplot, save
from marks import HANDLERS, worker_throughput
from sampling import RssSampler

from queueplane.kafka.target import KafkaTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from worker_support import read_all

PARTITIONS = 6
# A kmq micro-batch holds maxInFlight records per partition (all of them get their start markers
# at once): SPARK_BATCH_RECORDS in all, as many as the Spark pass-through's batches hold.
MAX_IN_FLIGHT = SPARK_BATCH_RECORDS // PARTITIONS


def apply_trivial_queue(folder: Path, target: KafkaTarget, group_type: str, concurrency: int) -> dict:
    return apply_queue(
        folder,
        target,
        {"type": group_type, "lockDuration": "30s", "maxInFlight": MAX_IN_FLIGHT},
        topic={"partitions": PARTITIONS},
        processing={"handler": "bench_handlers:trivial", "concurrency": concurrency},
    )


def marker_bytes(target: KafkaTarget, topic: str, records: int) -> dict:
    # A record carries the markers of a run of messages: a few hundred for 200k messages, all
    # written by the time the run counts, so the read ends once the topic is quiet.
    markers = read_all(target, topic, expect_at_least=1, timeout_s=120)
    payload = sum(len(m.key() or b"") + len(m.value() or b"") for m in markers)
    return {
        "markers": len(markers),
        "markers_per_message": round(len(markers) / records, 5),
        "payload_bytes_per_message": round(payload / records, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000, help="records a counted run; four batches a side")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds after the warm-up")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the warm-up, one run of each side under py-spy instead of the rounds; saves only the profiles",
    )
    args = parser.parse_args()
    result: dict = {
        "records": args.records,
        "partitions": PARTITIONS,
        "records_per_batch": MAX_IN_FLIGHT * PARTITIONS,
        "rounds": {"consumer": [], "kmq": []},
    }
    with bench_broker("qp-bench-kmq-") as (folder, target):
        marks = folder / "marks"
        marks.mkdir()
        os.environ["QP_BENCH_MARKS"] = str(marks)
        (folder / "bench_handlers.py").write_text(HANDLERS)

        def one_run(group_type: str, records: int) -> dict:
            queue = apply_trivial_queue(folder, target, group_type, args.concurrency)
            fill(target, queue["topic"], records)
            before = rss.cpu_seconds()
            measured = worker_throughput(queue["path"], target, records, marks)
            measured["cpu_s_per_100k_records"] = rss.cost_per_100k(before, records)
            if group_type == "kmq" and records == args.records and "marker_bytes" not in result:
                # Once, on a counted run: every run writes the same markers per message.
                result["marker_bytes"] = marker_bytes(target, f"{queue['topic']}.markers", records)
            return measured

        with RssSampler() as rss:
            # A warm-up of each side first (page cache, the broker's JIT), not counted; then rounds that
            # swap which side goes first, so neither gets the quieter moments alone. Each side's best counts.
            console.print("warm-up: one short run of each side, not counted")
            # kmq first: the runs share this process's Spark JVM, and only kmq reads through Spark's
            # Kafka source, whose jars go on the driver's classpath when its JVM starts.
            for group_type in ("kmq", "consumer"):
                one_run(group_type, max(2_000, args.records // 10))
            if args.profile:
                for group_type in ("consumer", "kmq"):
                    with profiled(f"kmq-{group_type}"):
                        console.print(one_run(group_type, args.records))
                return 0
            for round_no in range(args.rounds):
                order = ("consumer", "kmq") if round_no % 2 == 0 else ("kmq", "consumer")
                for group_type in order:
                    console.print(
                        f"round {round_no + 1}: trivial handler, {group_type} group, concurrency {args.concurrency}"
                    )
                    result["rounds"][group_type].append(one_run(group_type, args.records))
                    console.print(result["rounds"][group_type][-1])
    for group_type in ("consumer", "kmq"):
        result[group_type] = max(result["rounds"][group_type], key=lambda r: r["steady_records_per_s"])
    result["cpu_bound"] = cpu_bound(result)
    console.print(result["cpu_bound"])
    result["goals"] = [
        goal(
            "kmq worker / consumer-group worker",
            result["kmq"]["steady_records_per_s"],
            result["consumer"]["steady_records_per_s"],
            0.85,
        )
    ]
    save("kmq", result, plot(result))
    return 0


def cpu_bound(result: dict) -> dict:
    """Each side's CPU per 100k records in its best round, and the ratio the totals allow.

    Both sides keep the cores busy, so records/s is about cores / CPU a record: kmq can reach
    the consumer group's rate times the ratio of their totals, whatever its code waits on.
    """
    totals = {side: round(sum(result[side]["cpu_s_per_100k_records"].values()), 2) for side in ("consumer", "kmq")}
    return {
        "cpu_s_per_100k_records": {side: result[side]["cpu_s_per_100k_records"] for side in ("consumer", "kmq")},
        "total_cpu_s_per_100k_records": totals,
        "ratio_the_cpu_allows": round(totals["consumer"] / totals["kmq"], 3),
        "cores": os.cpu_count(),
    }


def plot(result: dict) -> Any:
    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    rates = [result["consumer"]["steady_records_per_s"], result["kmq"]["steady_records_per_s"]]
    left.bar(["consumer group", "kmq"], rates, color=["#c44e52", "#4c72b0"])
    left.set_ylabel("steady records/s")
    ratio = result["goals"][0]["ratio"]
    left.set_title(f"trivial handler, {result['partitions']} partitions: ratio {ratio:.2f} (goal >= 0.85)")
    m = result["marker_bytes"]
    right.bar(["key + value"], [m["payload_bytes_per_message"]], color="#55a868")
    right.set_ylabel("marker bytes per message")
    right.set_title(f"markers topic ({m['markers']} marker records for {result['records']:,} messages)")
    # Where each side's CPU went: stacked by process, one bar per side.
    sides = ("consumer", "kmq")
    costs = result["cpu_bound"]["cpu_s_per_100k_records"]
    bottom = [0.0, 0.0]
    for role in sorted({role for side in sides for role in costs[side]}):
        heights = [costs[side].get(role, 0.0) for side in sides]
        middle.bar(["consumer group", "kmq"], heights, bottom=bottom, label=role)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    middle.set_ylabel("CPU seconds per 100k records")
    allows = result["cpu_bound"]["ratio_the_cpu_allows"]
    middle.set_title(f"CPU by process: the totals allow a ratio of {allows:.2f}")
    middle.legend(fontsize="small")
    return fig


if __name__ == "__main__":
    sys.exit(main())
