"""Consumer-group worker benchmark: ordered throughput against ideals, a plain Python loop and Spark.

The seed scenario: 6 partitions, 32 keys (each key in one partition, records spread evenly
over the partitions), a handler sleeping 10 ms, 20k records.

1. ordering=partition: one record at a time per partition, ideal 6 / 10 ms = 600 records/s.
2. ordering=key with 8 slots: ideal from the keys per partition (a partition is as slow as
   its busiest key slot, FNV-1a of the keys modulo 8).
3. One hot key (every record the same key): one slot of one partition works, ideal 100/s.
4. Trivial handler (echoes the value to an output topic), at-least-once, ordering=key and
   ordering=partition, against Spark's Kafka-to-Kafka pass-through with the records crossing
   into a Python worker and back unchanged (``mapInArrow``, the least any Spark job with a
   Python step per record pays; goals >= 1.0 for ordering=partition, >= 0.9 for ordering=key),
   and against the consumer loop a team would write instead with confluent-kafka
   (bench/plain_consumer_loop.py: one process per core in one group, commit after the outputs
   are delivered) doing each record's share of any worker's work (``loop_with_duties``: the
   handler's record, the call under a clock, its outputs, the outcome counted; goal >= 0.6).
   exactlyOnce beside it (goal >= 0.8 of at-least-once). Reported, not goals: the ratio to the
   same loop without the duties, Spark's pass-through without Python, the duties inside
   Spark's Python step (``python_duties``: what a worker on Spark's Kafka source reached at
   most), and the runtime's slot path in plain processes that consume their partitions with
   their own consumers (``member_partition``, ``member_key``; bench/member_bound.py): the
   members runtime without Spark's leases, a bound from above.

Throughput comes from when each output record becomes visible to a read_committed reader that
reads the output topic during the run, the same way for the worker and every baseline (an
exactly-once run's records count when their transaction commits). The 10 ms scenarios count
all of them over the span from the first to the last (their ideals include the tail of the
busiest key slot); the trivial runs count the steady middle, 10% to 90% of the records
(bench/common.py), as the share benchmark does: a queue worker runs for hours, and the first
batch's Python workers starting up is not its throughput. The first-to-last figures are kept
beside. The trivial runs start with a shorter warm-up run of each side, not counted (a fresh
broker and Spark JVM compile each side's paths as it first runs), then alternate the sides for
``--rounds`` rounds, the order reversed every other round, and count each side's best.

    .venv/bin/python bench/consumer.py [--records 20000] [--trivial-records 300000] [--rounds 2] [--profile]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import member_bound
import plain_consumer_loop
from common import (
    SPARK_BATCH_RECORDS,
    apply_queue,
    bench_broker,
    console,
    full_rate,
    goal,
    profiled,
    pyplot,
    save,
    steady_rate,
)
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from sampling import RssSampler

from queueplane.kafka import clients
from queueplane.kafka.lag import queue_backlog
from queueplane.kafka.target import KafkaTarget
from queueplane.provision import steps
from queueplane.run.consumer.executor.ordering import key_slot
from queueplane.run.consumer.runtime import consumer_settings
from queueplane.run.driver.application import run_queue
from queueplane.run.driver.options import RunOptions

PARTITIONS, KEYS, SLOTS, SLEEP_S = 6, 32, 8, 0.010
CORES = os.cpu_count() or 2
# The trivial runs' sides: (ordering, exactlyOnce) of the queue each reads.
TRIVIAL_SIDES = {
    "worker_key": ("key", False),
    "worker_partition": ("partition", False),
    "exactly_once": ("key", True),
    "plain_loop": ("key", False),
    "loop_with_duties": ("key", False),
    "pass_through": ("key", False),
    "python_pass_through": ("key", False),
    "python_duties": ("key", False),
    "member_partition": ("partition", False),
    "member_key": ("key", False),
}

HANDLERS = """
import time
from queueplane import Output


def sleep_10ms(record):
    time.sleep(0.010)
    return Output(record.value)


def echo(record):
    return Output(record.value)
"""


def apply_consumer_queue(
    folder: Path, target: KafkaTarget, handler: str, ordering: str, exactly_once: bool = False
) -> dict:
    return apply_queue(
        folder,
        target,
        {"type": "consumer", "lockDuration": "30s", "maxInFlight": 2000, "ordering": ordering},
        with_output=True,
        topic={"partitions": PARTITIONS},
        processing={"handler": f"bench_handlers:{handler}", "concurrency": SLOTS, "exactlyOnce": exactly_once},
    )


def seed_layout(count: int, hot_key: bool = False) -> list[tuple[int, bytes]]:
    """(partition, key) per record: records evenly over partitions; key k lives in partition k % 6."""
    keys = [f"customer-{k:02d}".encode() for k in range(KEYS)]
    per_partition = {p: [k for i, k in enumerate(keys) if i % PARTITIONS == p] for p in range(PARTITIONS)}
    if hot_key:
        return [(0, keys[0])] * count
    return [
        (i % PARTITIONS, per_partition[i % PARTITIONS][(i // PARTITIONS) % len(per_partition[i % PARTITIONS])])
        for i in range(count)
    ]


def key_ideal(layout: list[tuple[int, bytes]]) -> float:
    """Records/s if every key slot ran flat out: each partition takes as long as its busiest slot."""
    load = Counter((p, key_slot(k, SLOTS)) for p, k in layout)
    slowest = max(load.values()) * SLEEP_S
    return len(layout) / slowest


def fill(target: KafkaTarget, topic: str, layout: list[tuple[int, bytes]]) -> None:
    producer = clients.producer(target.settings, {"linger.ms": 5})
    for i, (partition, key) in enumerate(layout):
        while True:
            try:
                producer.produce(topic, key=key, value=b'{"id": %d}' % i, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


class Visible(threading.Thread):
    """When each record of ``topic`` becomes visible to a read_committed reader: its arrival here.

    Started before a run and read while it goes, so an exactly-once run's records are counted
    when their transaction commits (their write timestamps are earlier), and every side, the
    baselines included, is timed at the same point.
    """

    def __init__(self, target: KafkaTarget, topic: str):
        super().__init__(daemon=True)
        self.stamps: list[float] = []
        self._stop_reading = threading.Event()
        self._consumer = clients.consumer(
            target.settings,
            {
                "group.id": f"bench-reader-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            },
        )
        # Assigned, not subscribed: it reads from the first record on, with no group join to wait
        # for while the outputs already arrive (they would be stamped late, all at once).
        partitions = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self.start()

    def run(self) -> None:
        while not self._stop_reading.is_set():
            messages = self._consumer.consume(1000, 0.2)
            now = time.time()
            self.stamps += [now] * sum(1 for m in messages if m.error() is None)
        self._consumer.close()

    def wait(self, expected: int, timeout_s: float = 600) -> list[float]:
        """The arrival times once ``expected`` records arrived (or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        while len(self.stamps) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        self._stop_reading.set()
        self.join()
        return self.stamps


def run_worker(spec: dict, target: KafkaTarget, records: int) -> list[float]:
    (queue,) = steps.validate([str(spec["path"])], target)
    visible = Visible(target, spec["output"])
    summary = run_queue(queue, target, RunOptions(max_records=records), backlog=queue_backlog(target, queue))
    done = summary.counts.get("accepted", 0)
    assert done >= records, summary.counts
    return visible.wait(records)


def run_plain_loop(
    spec: dict, target: KafkaTarget, records: int, duties: tuple[str, list[str]] | None = None
) -> list[float]:
    """The plain confluent-kafka loop (bench/plain_consumer_loop.py), one process per core, until all are out.

    ``duties``: the loop also does each record's share of any worker's work (the handler and its search paths).
    """
    visible = Visible(target, spec["output"])
    finish = plain_consumer_loop.run(target.settings, spec["group"], spec["topic"], spec["output"], CORES, duties)
    try:
        return visible.wait(records)
    finally:
        finish()


def run_members(spec: dict, target: KafkaTarget, records: int) -> list[float]:
    """The slot path fed by consumers of its own (bench/member_bound.py), one process per core, until all are out."""
    (queue,) = steps.validate([str(spec["path"])], target)
    visible = Visible(target, spec["output"])
    finish = member_bound.run(consumer_settings(queue, target).to_json(), spec["topic"], PARTITIONS, CORES)
    try:
        return visible.wait(records)
    finally:
        finish()


def python_identity(batches: Iterator[Any]) -> Iterator[Any]:
    """The Python pass-through's step: every Arrow batch back as it came."""
    yield from batches


def with_duties(search_path: str, batches: Iterator[Any]) -> Iterator[Any]:
    """The Python step doing a worker's per-record duties: the handler's record from the Arrow
    batch (the runtime's own ``input_records``), the call under a clock, its outputs as records;
    their keys and values go back to Spark, whose sink writes them."""
    import pyarrow as pa

    from queueplane.handler_api import outputs_of
    from queueplane.run.executor.handler import load_handler
    from queueplane.run.executor.outputs import output_record
    from queueplane.run.spark.kafka_input import input_records

    handler = load_handler("bench_handlers:echo", [search_path])
    clock = time.monotonic
    for batch in batches:
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        latency_s = 0.0
        for record in input_records(batch):
            started = clock()
            for _topic, key, value, _headers in [output_record(o, record, "") for o in outputs_of(handler(record))]:
                keys.append(key)
                values.append(value)
            latency_s += clock() - started
        yield pa.RecordBatch.from_arrays([binary_column(keys), binary_column(values)], names=["key", "value"])


def binary_column(values: list[bytes | None]) -> Any:
    """Bytes as an Arrow array from its buffers: ``pa.array`` would import pandas in every worker."""
    from array import array
    from itertools import accumulate

    import pyarrow as pa

    from queueplane.run.outcomes import validity_bitmap

    present = [v or b"" for v in values]
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, present)))
    buffers = [validity_bitmap(values), pa.py_buffer(offsets), pa.py_buffer(b"".join(present))]
    return pa.Array.from_buffers(pa.binary(), len(values), buffers)


def pass_through(
    target: KafkaTarget, spec: dict, records: int, python: bool = False, duties: str | None = None
) -> list[float]:
    """The baseline: Spark's Kafka source straight into Spark's Kafka sink, no Python in between.

    ``python``: the records cross into a Python worker and back unchanged (``mapInArrow``), the
    least any Spark job with a Python step per record pays; reported beside, not the goal's baseline.
    ``duties``: the Python step does a worker's duties instead (``with_duties``, the handler's folder).
    """
    from pyspark.sql import SparkSession

    from queueplane.run.spark.kafka_input import INPUT_COLUMNS, kafka_options, kafka_source, with_kafka_connector
    from queueplane.run.spark.session import DAEMON_MODULE, SPARK_LOG4J

    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName("bench-pass-through").master(f"local[{max(CORES, PARTITIONS)}]")
    spark = (
        with_kafka_connector(builder)
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{SPARK_LOG4J}")
        .getOrCreate()
    )
    source = (
        kafka_source(spark, target, spec["topic"], spec["group"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(SPARK_BATCH_RECORDS))
    )
    if duties:  # the worker's own input: its columns, headers included
        step = functools.partial(with_duties, duties)
        frame = source.option("includeHeaders", "true").load().selectExpr(*INPUT_COLUMNS)
        frame = frame.mapInArrow(step, "key binary, value binary")
    else:
        frame = source.load().selectExpr("key", "value")
    if python:
        frame = frame.mapInArrow(python_identity, "key binary, value binary")
    visible = Visible(target, spec["output"])
    checkpoint = tempfile.TemporaryDirectory(prefix="qp-bench-pass-")  # removed with the run
    query = (
        frame.writeStream.format("kafka")
        .options(**kafka_options(target))
        .option("topic", spec["output"])
        .option("checkpointLocation", checkpoint.name)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        return visible.wait(records)
    finally:
        query.stop()
        spark.stop()
        checkpoint.cleanup()


def kafka_connector_on_the_jvm() -> None:
    """Spark's Kafka source and sink on the classpath of the one JVM this process starts.

    The pass-through baselines read and write through them, and no worker loads them: the
    workers' sessions come first and start the JVM, and jars given to a later session do not
    reach the driver's data source lookup.
    """
    from queueplane.run.spark.kafka_input import connector_in_pyspark, connector_jars

    if connector_in_pyspark():
        return
    jars = ",".join(str(jar) for jar in connector_jars())
    given = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {jars} {given}"


def main() -> int:
    kafka_connector_on_the_jvm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--hot-records", type=int, default=2_000)
    parser.add_argument("--trivial-records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the trivial runs")
    parser.add_argument(
        "--only",
        help="comma-separated trivial sides to run, skipping the 10 ms scenarios; prints the rates, saves nothing",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the rounds, one more trivial run of each worker, members and plain loop side under py-spy",
    )
    args = parser.parse_args()
    result: dict = {
        "records": args.records,
        "partitions": PARTITIONS,
        "keys": KEYS,
        "slots": SLOTS,
    }
    with bench_broker("qp-bench-consumer-") as (folder, target), RssSampler() as cpu:
        (folder / "bench_handlers.py").write_text(HANDLERS)
        layout = seed_layout(args.records)
        scenarios = [
            ("partition", "partition", layout, PARTITIONS / SLEEP_S),
            ("key", "key", layout, key_ideal(layout)),
            ("hot_key", "key", seed_layout(args.hot_records, hot_key=True), 1 / SLEEP_S),
        ]
        for name, ordering, records, ideal in [] if args.only else scenarios:
            spec = apply_consumer_queue(folder, target, "sleep_10ms", ordering)
            fill(target, spec["topic"], records)
            console.print(f"10 ms handler, ordering={ordering} ({name}), {len(records)} records")
            rate = full_rate(run_worker(spec, target, len(records)))
            result[name] = {
                "records": len(records),
                "records_per_s": rate,
                "ideal_records_per_s": round(ideal, 1),
                "ratio_to_ideal": round(rate / ideal, 3),
            }
            console.print(result[name])
        trivial_layout = seed_layout(args.trivial_records)
        sides = {side: TRIVIAL_SIDES[side] for side in args.only.split(",")} if args.only else TRIVIAL_SIDES
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}

        def trivial_run(side: str, label: str, layout: list[tuple[int, bytes]]) -> dict[str, float]:
            ordering, exactly_once = sides[side]
            spec = apply_consumer_queue(folder, target, "echo", ordering, exactly_once)
            fill(target, spec["topic"], layout)
            console.print(f"{label}: trivial handler, {side}, {len(layout)} records")
            before = cpu.cpu_seconds()
            if side == "plain_loop":
                stamps = run_plain_loop(spec, target, len(layout))
            elif side == "loop_with_duties":
                stamps = run_plain_loop(spec, target, len(layout), ("bench_handlers:echo", [str(folder)]))
            elif side.startswith("member_"):
                stamps = run_members(spec, target, len(layout))
            elif side == "python_duties":
                stamps = pass_through(target, spec, len(layout), duties=str(folder))
            elif side.endswith("pass_through"):
                stamps = pass_through(target, spec, len(layout), side == "python_pass_through")
            else:
                stamps = run_worker(spec, target, len(layout))
            rates: dict[str, Any] = {"steady": steady_rate(stamps), "first_to_last": full_rate(stamps)}
            rates["cpu_s_per_100k_records"] = cpu.cost_per_100k(before, len(layout))
            console.print(rates)
            return rates

        # A warm-up run of each side first, not counted: the broker and Spark's JVM start cold
        # (their JIT compiles the paths each side uses), and whichever side ran first paid for it.
        warm_up_layout = seed_layout(max(PARTITIONS * 1_000, args.trivial_records // 3))
        result["warm_up"] = {side: trivial_run(side, "warm-up (not counted)", warm_up_layout) for side in sides}
        # Rounds alternate the sides, and the order, so neither gets the quieter moments alone;
        # each side's best round counts (on a shared machine, noise only ever slows a run down).
        for round_no in range(1, args.rounds + 1):
            order = list(sides) if round_no % 2 else list(reversed(sides))
            for side in order:
                runs[side].append(trivial_run(side, f"round {round_no}", trivial_layout))
        best = {side: max(r["steady"] for r in runs[side]) for side in sides}
        if args.profile:  # after the rounds, not counted: py-spy's sampling takes a share of the cores
            profiled_sides = ("worker_partition", "worker_key", "member_partition", "member_key", "plain_loop")
            for side in [s for s in profiled_sides if s in sides]:
                ordering, exactly_once = sides[side]
                spec = apply_consumer_queue(folder, target, "echo", ordering, exactly_once)
                fill(target, spec["topic"], trivial_layout)
                console.print(f"profiled: trivial handler, {side}")
                with profiled(f"consumer-{side}"):
                    if side == "plain_loop":
                        run_plain_loop(spec, target, len(trivial_layout))
                    elif side.startswith("member_"):
                        run_members(spec, target, len(trivial_layout))
                    else:
                        run_worker(spec, target, len(trivial_layout))
        if args.only:
            console.print(best)
            return 0
        result["trivial"] = {
            "records": len(trivial_layout),
            "processes": CORES,
            "rounds": runs,
            "records_per_s": best,
        }
        # Not a goal: what no worker design can pass here, the plain loop doing a worker's per-record duties.
        result["trivial"]["duties_bound"] = round(best["loop_with_duties"] / best["plain_loop"], 3)
        # Nor this: what a worker on Spark's Kafka source reaches at most, beside the goal's baseline.
        result["trivial"]["spark_duties_bound"] = round(best["python_duties"] / best["python_pass_through"], 3)
        # Nor this: what a worker reading with consumers of its own would reach at most (bench/member_bound.py).
        result["trivial"]["member_bound"] = {
            o: round(best[f"member_{o}"] / best["python_pass_through"], 3) for o in ("key", "partition")
        }
        # Not goals: where each side's CPU went, per 100k records, in its best round (processes by
        # role: this process, which runs the worker's driver and Spark's in-process sides; the
        # broker; Spark's JVM; Spark's Python workers; the plain loops' and members' processes).
        # On two cores a side's rate follows its total: worker_* against member_* is what Spark's
        # hosting costs the members' path.
        result["trivial"]["cpu_s_per_100k_records"] = {
            side: max(runs[side], key=lambda run: run["steady"])["cpu_s_per_100k_records"] for side in sides
        }
        # Reported, not goals: the plain loop keeps none of a worker's duties (duties_bound says what they cost it).
        result["trivial"]["ratio_to_plain_loop"] = {
            o: round(best[f"worker_{o}"] / best["plain_loop"], 3) for o in ("key", "partition")
        }
        result["goals"] = [
            *(
                goal(
                    f"consumer worker, 10 ms handler, ordering={o} / ideal",
                    result[o]["records_per_s"],
                    result[o]["ideal_records_per_s"],
                    0.9,
                )
                for o in ("partition", "key")
            ),
            goal(
                "consumer worker, ordering=partition / Spark pass-through via Python",
                best["worker_partition"],
                best["python_pass_through"],
                1.0,
            ),
            goal(
                "consumer worker, ordering=key / Spark pass-through via Python",
                best["worker_key"],
                best["python_pass_through"],
                0.9,
            ),
            *(
                goal(
                    f"consumer worker, ordering={o} / plain loop with a worker's duties",
                    best[f"worker_{o}"],
                    best["loop_with_duties"],
                    0.6,
                )
                for o in ("partition", "key")
            ),
            goal("consumer worker, exactlyOnce / at-least-once", best["exactly_once"], best["worker_key"], 0.8),
        ]
        console.print(result["trivial"])
    save("consumer", result, plot(result))
    return 0


def plot(result: dict) -> Any:
    plt = pyplot()
    fig, axes = plt.subplot_mosaic(
        [["left", "right"], ["cpu", "cpu"]], figsize=(16, 11), gridspec_kw={"width_ratios": [2, 3]}
    )
    left, right, cpu = axes["left"], axes["right"], axes["cpu"]
    names = ["partition", "key", "hot_key"]
    labels = ["ordering=partition", f"ordering=key, {result['slots']} slots", "one hot key"]
    ideal = [result[n]["ideal_records_per_s"] for n in names]
    measured = [result[n]["records_per_s"] for n in names]
    x = range(len(names))
    left.bar([i - 0.2 for i in x], ideal, width=0.4, label="ideal", color="#cccccc")
    left.bar([i + 0.2 for i in x], measured, width=0.4, label="worker", color="#4c72b0")
    for i, n in enumerate(names):
        left.text(i + 0.2, measured[i], f"{result[n]['ratio_to_ideal']:.2f}", ha="center", va="bottom")
    left.set_xticks(list(x), labels)
    left.set_ylabel("records/s")
    left.set_title(f"10 ms handler, {result['partitions']} partitions, {result['keys']} keys (goal >= 0.9)")
    left.legend()
    rates = result["trivial"]["records_per_s"]
    bars = {
        "plain_loop": "plain\nconfluent-kafka",
        "loop_with_duties": "plain loop with\na worker's duties",
        "pass_through": "Spark\npass-through",
        "python_pass_through": "Spark pass-\nthrough via Python",
        "python_duties": "the same with\na worker's duties",
        "member_key": "slot path, own\nconsumers, key",
        "member_partition": "slot path, own\nconsumers, partition",
        "worker_key": "worker\nordering=key",
        "worker_partition": "worker\nordering=partition",
        "exactly_once": "worker\nexactlyOnce",
    }
    colors = ["#8172b3", "#937860", "#c44e52", "#dd8452", "#da8bc3"]  # the baselines and bounds
    colors += ["#8c8c8c", "#b0b0b0", "#4c72b0", "#64b5cd", "#55a868"]  # the members' bound, the worker
    right.bar(list(bars.values()), [rates[side] for side in bars], color=colors)
    right.set_ylabel("records/s (steady, visible to read_committed readers)")
    trivial_goals = result["goals"][2:]
    right.set_title(
        "trivial handler\n" + "\n".join(f"{g['goal']}: {g['ratio']:.2f} ({g['bound']})" for g in trivial_goals),
        fontsize=8,
    )
    right.tick_params(axis="x", labelsize=7, labelrotation=30)
    costs = result["trivial"].get("cpu_s_per_100k_records", {})
    shown = [side for side in bars if side in costs]
    roles = sorted({role for side in shown for role in costs[side]})
    bottom = [0.0] * len(shown)
    for role in roles:
        values = [costs[side].get(role, 0.0) for side in shown]
        cpu.bar([bars[side] for side in shown], values, bottom=bottom, label=role.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    cpu.set_ylabel("CPU seconds per 100k records")
    cpu.set_title("where each side's CPU went (its best round); on two cores the rate follows the total", fontsize=9)
    cpu.tick_params(axis="x", labelsize=7, labelrotation=30)
    if roles:
        cpu.legend(fontsize=8)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
