"""Handlers that write down when each call finished, and the readings made from what they wrote.

The benchmarks count a record as finished when its handler call returns, the same way for the
worker and for a baseline running the same handler module, and cut each run's steady middle
out of those times (``common.steady_rate``).
"""

from __future__ import annotations

from array import array
from pathlib import Path

from common import full_rate, steady_rate

from queueplane.kafka.lag import queue_backlog
from queueplane.kafka.target import KafkaTarget
from queueplane.provision import steps
from queueplane.run.driver.application import run_queue
from queueplane.run.driver.options import RunOptions

HANDLERS = """
import os
import threading
import time
from array import array

# Every call's finishing time, kept in memory (a list append costs next to nothing per call) and
# appended to this process's file five times a second by a background thread, so the benchmark
# can cut the run's steady middle out of all calls. Spark ends its Python workers without exit
# handlers, hence the thread. The file holds raw doubles: written as text (repr per time), the
# flush took a quarter of the worker process's interpreter time under the trivial handler.
_finished = []


def _flush_forever():
    path = os.path.join(os.environ["QP_BENCH_MARKS"], f"finished-{os.getpid()}")
    written = 0
    while True:
        time.sleep(0.2)
        count = len(_finished)
        if count > written:
            with open(path, "ab") as handle:
                array("d", _finished[written:count]).tofile(handle)
            written = count


threading.Thread(target=_flush_forever, daemon=True).start()


def sleep_10ms(record):
    time.sleep(0.010)
    _finished.append(time.time())


def trivial(record):
    _finished.append(time.time())
"""


def finishing_times(marks_dir: Path, pattern: str) -> list[float]:
    """The finishing times the handler calls (or the plain loop) wrote into ``marks_dir``."""
    finished: list[float] = []
    for path in marks_dir.glob(pattern):
        data, times = path.read_bytes(), array("d")
        times.frombytes(data[: len(data) - len(data) % times.itemsize])  # a flush may be under way
        finished += times
    return finished


def worker_throughput(spec: Path, target: KafkaTarget, records: int, marks_dir: Path) -> dict:
    """Steady records/s of the worker, from the finishing times its handler calls wrote down."""
    (queue,) = steps.validate([str(spec)], target)
    for old in marks_dir.glob("finished-*"):
        old.unlink()
    summary = run_queue(queue, target, RunOptions(max_records=records), backlog=queue_backlog(target, queue))
    finished = finishing_times(marks_dir, "finished-[0-9]*")
    done = summary.counts.get("accepted", 0) + summary.counts.get("dlq", 0)
    return {
        "records": done,
        "steady_records_per_s": steady_rate(finished, done),
        "first_to_last_records_per_s": full_rate(finished),
        "counts": summary.counts,
    }


def marked(marks_dir: Path) -> int:
    """Handler calls written down so far (each a double), across the processes' files."""
    return sum(path.stat().st_size for path in marks_dir.glob("finished-[0-9]*")) // array("d").itemsize
