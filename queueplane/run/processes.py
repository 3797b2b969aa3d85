"""What a Spark Python worker process keeps for a queue from one task to the next.

Spark reuses its Python workers (``spark.python.worker.reuse``), so every runtime keeps its
handler, producer and threads in a module-level registry keyed by the settings JSON: the
first task of a process builds them, later tasks find them, and they are closed when the
process exits (share consumers leave their group then, producers flush). The three
runtimes differ in what they keep, not in how they keep it, so the keeping lives here once.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from queueplane.kafka import clients

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"
# Handler threads mostly wait (I/O, sleeps) and then need the GIL back for a few microseconds.
# CPython lets a busy thread keep the GIL 5 ms before it must hand over; at 1 ms a waiting call
# gets it back sooner (the tail latency of a 10 ms handler fell, docs/benchmarks.md), at the cost
# of more frequent switches, which I/O-bound pools barely notice.
GIL_SWITCH_INTERVAL_S = 0.001
# CPython collects its youngest generation every 700 net allocations of container objects, and
# a worker makes about ten a record (the record, its call, its outputs, its row): a collection
# every 70 records, and a full one, walking every object the task holds, every 7,000 (measured
# in docs/design/consumer-throughput.md). Cyclic garbage waits longer for its collection, and no
# longer than the task: pyspark's worker runs a full collection after every task.
GC_THRESHOLDS = (10_000, 10, 10)


def tune_interpreter() -> None:
    """The interpreter settings of a process that runs a queue's handlers (above)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_what_lives() -> None:
    """Keep the process's long-lived objects out of every later garbage collection.

    What a process builds for its queue (the runtime's modules, pyarrow, the handler, clients)
    lives as long as the process; pyspark's worker loop runs a full collection after every
    task, and a busy handler's allocations set off more, each walking all of it again (some
    50,000 objects: 10-15 ms per collection). Frozen after a collection, they are skipped; only
    what is alive then is kept, so no garbage is frozen with them.
    """
    gc.collect()
    gc.freeze()


class Closable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closable)


class PerProcess(Generic[T]):
    """One ``T`` per settings JSON in this process, made on first use and closed at exit."""

    def __init__(self, make: Callable[[str], T]):
        self._make = make
        self._made: dict[str, T] = {}
        self._lock = threading.Lock()
        atexit.register(self.close_all)

    def get(self, settings_json: str) -> T:
        if not logging.getLogger().handlers:  # Spark's Python workers: log to stderr, which Spark keeps
            logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
            clients.report_errors()
        with self._lock:
            made = self._made.get(settings_json)
            if made is None:
                tune_interpreter()
                made = self._made[settings_json] = self._make(settings_json)
                freeze_what_lives()
            return made

    def close_all(self) -> None:
        for made in list(self._made.values()):
            made.close()


class ServedProducer:
    """An idempotent producer whose delivery callbacks a background thread serves.

    Handler threads produce and go on; the callbacks (which settle records, release
    semaphores, or report a failed write) run on this thread, so no handler waits on another's poll.
    """

    def __init__(
        self,
        kafka: dict[str, Any],
        linger_ms: int,
        batch_bytes: int | None = None,
        errors_only: bool = False,
        on_failed: Callable[[Any, Any], None] | None = None,
    ):
        """``batch_bytes``: batches no larger than the topics take, so a refused batch is one record.

        ``errors_only``: callbacks only for writes that failed. A caller that learns durability
        another way (``all_delivered``) saves a Python call per record on this thread.
        ``on_failed``: the callback of a write produced without its own (failed_writes.FailedWrites).
        """
        extra: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": linger_ms}
        if errors_only:
            extra["delivery.report.only.error"] = True
        if on_failed is not None:
            extra["on_delivery"] = on_failed
        if batch_bytes:
            extra["batch.size"] = min(batch_bytes, 1_000_000)
        self.producer = clients.producer(kafka, extra)
        self._stop = threading.Event()
        threading.Thread(target=self._serve, name="qp-delivery", daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def all_delivered(self, within_s: float) -> bool:
        """Whether, within ``within_s``, every record produced so far is acknowledged and its
        callback (an error's) has run: the producer counts a record until then."""
        deadline = time.monotonic() + within_s
        while len(self.producer) > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self.producer.flush(10)
