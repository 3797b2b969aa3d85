"""The consumer runtime's slot path alone: what it costs a record next to the plain loop with a worker's duties.

Both designs of the consumer-group worker (Spark's Kafka source today, the group members of
docs/design/consumer-throughput.md) hand records to a ``PartitionTask``: slot threads, retries in
place, the crash journal, the offset tracker, outcome rows and commits. This benchmark feeds the
records of one partition to one task in this process, with a trivial handler whose output goes to
a real broker, and beside it runs the same records through the plain loop with a worker's duties
(the handler's record, the call under a clock, its outputs produced through the runtimes' own
``produce``, one flush at the end). No Spark, no consumer: the records are read into memory first.

Each side's wall time and this process's CPU time per record, in alternating rounds; each side's
best counts, and the ratio of their rates is what the slot path keeps of the loop.

    .venv/bin/python bench/slot_path.py [--records 200000] [--rounds 3] [--ordering partition]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import apply_queue, bench_broker, console
from consumer import HANDLERS, fill
from plain_consumer_loop import with_duties

from queueplane.handler_api import Record
from queueplane.provision import steps
from queueplane.run.consumer.executor.partition import PartitionTask
from queueplane.run.consumer.executor.process import WorkerProcess
from queueplane.run.consumer.runtime import consumer_settings
from queueplane.run.executor.processes import tune_interpreter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from worker_support import read_all

CHUNK = 2000  # records a feed hands over, as a consume() or an Arrow batch would


@contextlib.contextmanager
def inputs_frozen() -> Iterator[None]:
    """The side's inputs, read ahead into memory, out of the garbage collector's sight while it runs.

    A worker holds one batch of records at a time; here every record of the run is alive from
    the start, and each full collection would walk all of them: a cost of this benchmark's
    read-ahead, not of the side it times.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def slot_side(process: WorkerProcess, topic: str, messages: list[Any]) -> tuple[float, float]:
    # Plain records, as kafka_input.input_records makes them from Spark's Arrow batches.
    records = [
        Record.make(m.key(), m.value(), (), m.topic(), m.partition(), m.offset(), 1, m.timestamp()[1]) for m in messages
    ]
    task = PartitionTask(process, topic, 0)
    with inputs_frozen():
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(records), CHUNK):
            task.feed(records[start : start + CHUNK])
            task.drain()
        task.finish(records[-1].offset + 1)
        task.drain()
        return time.perf_counter() - wall, time.process_time() - cpu


def loop_side(process: WorkerProcess, output: str, messages: list[Any]) -> tuple[float, float]:
    with inputs_frozen():
        wall, cpu = time.perf_counter(), time.process_time()
        with_duties(process.handler, messages, output, process.producer)
        process.delivery.all_delivered(120)
        return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ordering", default="partition", choices=("partition", "key"))
    args = parser.parse_args()
    tune_interpreter()  # as in the worker's processes, for both sides
    with bench_broker("qp-bench-slots-") as (folder, target):
        (folder / "bench_handlers.py").write_text(HANDLERS)
        best: dict[str, float] = {}
        for round_no in range(1, args.rounds + 1):
            # A new queue (group, committed offsets) each round: a task skips what its group committed.
            spec = apply_queue(
                folder,
                target,
                {"type": "consumer", "lockDuration": "30s", "maxInFlight": 2000, "ordering": args.ordering},
                with_output=True,
                topic={"partitions": 1},
                processing={"handler": "bench_handlers:echo", "concurrency": 8},
            )
            (queue,) = steps.validate([str(spec["path"])], target)
            fill(target, spec["topic"], [(0, b"customer-%02d" % (i % 32)) for i in range(args.records)])
            messages = read_all(target, spec["topic"], expect_at_least=args.records, timeout_s=120)
            process = WorkerProcess(consumer_settings(queue, target))
            sides = ("slot_path", "loop_with_duties") if round_no % 2 else ("loop_with_duties", "slot_path")
            for side in sides:
                if side == "slot_path":
                    wall, cpu = slot_side(process, spec["topic"], messages)
                else:
                    wall, cpu = loop_side(process, spec["output"], messages)
                rate = args.records / wall
                best[side] = max(best.get(side, 0.0), rate)
                console.print(
                    f"round {round_no} {side}: {rate:,.0f} records/s, {cpu / args.records * 1e6:.1f} CPU-µs a record"
                    " in this process"
                )
            process.close()
        console.print(best, f"ratio {best['slot_path'] / best['loop_with_duties']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
