"""What a Spark Python worker process keeps for a queue from one task to the next.

Spark reuses its Python workers (``spark.python.worker.reuse``), so every runtime keeps its
handler, producer and threads in a module-level registry keyed by the settings JSON: the
first task of a process builds them, later tasks find them, and they are closed when the
process exits (share consumers leave their group then, producers flush). The three
runtimes differ in what they keep, not in how they keep it, so the keeping lives here once.

The spec's ``processing.setup`` runs here too, for every runtime: in ``PerProcess.get``, before
the task hands the handler a record, once until a teardown. ``processing.teardown`` runs when a
process drains (``PerProcess.drained``: a share task's draining batch) and when it ends. Spark's
daemon ends its forked workers with ``os._exit`` (no ``atexit``) and, at a stop, with SIGHUP, so
the ends are caught where they happen: the daemon's worker function and a thread that waits for
SIGHUP (``teardown_at_exit``, put in place by queueplane.run.spark.daemon), and ``atexit`` in a
process that exits as Python processes do.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import KafkaException

from queueplane.kafka import clients
from queueplane.run.executor.handler import ProcessHooks

log = logging.getLogger("queueplane.worker")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"
# Handler threads mostly wait (I/O, sleeps) and then need the GIL back for a few microseconds.
# CPython lets a busy thread keep the GIL 5 ms before it must hand over; at 1 ms a waiting call
# gets it back sooner (the tail latency of a 10 ms handler fell, docs/benchmarks.md), at the cost
# of more frequent switches, which I/O-bound pools barely notice.
GIL_SWITCH_INTERVAL_S = 0.001
# CPython collects its youngest generation every 700 net allocations of container objects, and
# a worker makes several a record (its message and record, its outputs, what waits for its
# commit). A busy consumer worker keeps up to a second of records until their commit, so a young
# collection walks mostly records still alive, and walks them again as they age. At 100,000 most
# of them are gone before the collection that would walk them: a trivial handler's worker spent
# half the time collecting that it spent at 10,000 (bench/consumer.py, timed by gc.callbacks).
# Cyclic garbage waits for 100,000 net allocations.
GC_THRESHOLDS = (100_000, 10, 10)
# The full collection pyspark runs after every task, at most this often (AfterTaskCollection).
FULL_COLLECTION_EVERY_S = 60.0


def tune_interpreter() -> None:
    """The interpreter settings of a process that runs a queue's handlers (above)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)


class AfterTaskCollection:
    """What pyspark's daemon collects between a worker's tasks: a full collection at most once a
    minute (``FULL_COLLECTION_EVERY_S``), nothing otherwise.

    pyspark's worker loop collects everything after every task, to free a batch task's memory
    for the next. A queue's worker process keeps its records in flight across tasks (held,
    in its slots, awaiting their commit): a full collection walked all of them once a slice,
    near a tenth of a busy worker's Python time. The interpreter's own collections (``GC_THRESHOLDS``)
    still free cyclic garbage as it builds up.
    """

    def __init__(self, every_s: float = FULL_COLLECTION_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = every_s
        self._clock = clock
        self._last = clock()

    def collect(self) -> int:
        """Unreachable objects found (0 when it is not yet time for a collection)."""
        now = self._clock()
        if now - self._last < self._every_s:
            return 0
        self._last = now
        return gc.collect()


def freeze_what_lives() -> None:
    """Keep the process's long-lived objects out of every later garbage collection.

    What a process builds for its queue (the runtime's modules, pyarrow, the handler, clients)
    lives as long as the process; a busy handler's allocations set off full collections, each
    walking all of it again (some 50,000 objects: 10-15 ms per collection). Frozen after a
    collection, they are skipped; only what is alive then is kept, so no garbage is frozen with
    them.
    """
    gc.collect()
    gc.freeze()


class Closable(Protocol):
    def close(self) -> None: ...


T = TypeVar("T", bound=Closable)


def hooks_in_settings(settings_json: str) -> ProcessHooks:
    """The ``setup`` and ``teardown`` a runtime's settings name (QueueSettings), imported."""
    fields = json.loads(settings_json)
    return ProcessHooks.load(fields.get("setup"), fields.get("teardown"), fields.get("search_paths") or ())


class PerProcess(Generic[T]):
    """One ``T`` per settings JSON in this process, made on first use and closed at exit, beside
    the queue's process hooks (``processing.setup``, ``processing.teardown``)."""

    def __init__(self, make: Callable[[str], T], hooks: Callable[[str], ProcessHooks] = hooks_in_settings):
        self._make = make
        self._hooks_of = hooks
        self._made: dict[str, T] = {}
        self._hooks: dict[str, ProcessHooks] = {}
        self._lock = threading.Lock()
        atexit.register(self.close_all)
        _REGISTRIES.append(self)

    def get(self, settings_json: str) -> T:
        """The process's ``T`` for these settings, with the queue's setup run (again, after a drain)."""
        if not logging.getLogger().handlers:  # Spark's Python workers: log to stderr, which Spark keeps
            logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
            clients.report_errors()
        with self._lock:
            made, hooks = self._made.get(settings_json), self._hooks.get(settings_json)
            fresh = made is None or hooks is None
            if made is None or hooks is None:
                hooks = self._hooks_of(settings_json)  # a hook that cannot be imported fails the task
                tune_interpreter()
                made = self._made[settings_json] = self._make(settings_json)
                self._hooks[settings_json] = hooks
            try:
                hooks.start()
            finally:
                if fresh:
                    freeze_what_lives()
        return made

    def drained(self, settings_json: str) -> None:
        """The process drained this queue: its handler gets no record until the next ``get``."""
        hooks = self._hooks.get(settings_json)
        if hooks is not None:
            hooks.end()

    def end_hooks(self) -> None:
        for hooks in list(self._hooks.values()):
            hooks.end()

    def close_all(self) -> None:
        for made in list(self._made.values()):
            made.close()
        self.end_hooks()


_REGISTRIES: list[PerProcess[Any]] = []


def end_all_hooks() -> None:
    """Teardown of every queue whose setup ran in this process: it is about to end."""
    for registry in list(_REGISTRIES):
        registry.end_hooks()


def _watch_hangup() -> None:
    """In a worker Spark's daemon forked: teardown before a SIGHUP (the daemon's stop) ends it.

    pyspark's worker resets SIGHUP to its default before every task and waits for the next one
    with it, so a handler would be gone when the signal comes. Blocked instead, SIGHUP waits for
    a thread of its own, which runs teardown and then lets the signal end the process as before.
    Every later thread inherits the block: the forked worker has no other thread yet.
    """
    global _hangup_watched
    if _hangup_watched:
        return
    _hangup_watched = True
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    threading.Thread(target=_on_hangup, name="qp-hangup", daemon=True).start()


_hangup_watched = False


def _on_hangup() -> None:
    signal.sigwait({signal.SIGHUP})
    try:
        end_all_hooks()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # this thread only: it takes the signal
        os.kill(os.getpid(), signal.SIGHUP)


def teardown_at_exit(worker: Callable[..., int]) -> Callable[..., int]:
    """Spark's daemon's worker function (``pyspark.daemon.worker``), with teardown before the
    process ends. A forked worker runs it once per task and ends with ``os._exit`` when it
    returns non-zero (Spark closed the worker's socket: an idle worker, a stop; or its task
    failed) or raises, or when workers are not reused."""

    def worker_then_teardown(*args: Any) -> int:
        _watch_hangup()
        try:
            code = worker(*args)
        except BaseException:
            end_all_hooks()
            raise
        if code or not os.environ.get("SPARK_REUSE_WORKER"):
            end_all_hooks()
        return code

    return worker_then_teardown


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
        # The gate of writers that honour it (``wait_to_write``): shut while a commit learns that
        # everything written before it is acknowledged (``writes_held``).
        self.writes_open = True
        self._reopened = threading.Event()
        self._reopened.set()
        threading.Thread(target=self._serve, name="qp-delivery", daemon=True).start()

    def _serve(self) -> None:
        """Serve the producer's callbacks until closed. A fatal error (an idempotent producer
        refused its producer id: credentials or ACLs revoked) is raised by every poll from then
        on; it is said once, and the thread goes on serving the callbacks of the writes that fail,
        through which their owners fail their tasks."""
        said = False
        while not self._stop.is_set():
            try:
                self.producer.poll(clients.SERVE_POLL_S)
            except KafkaException as exc:
                if not said:
                    log.warning("the worker's producer failed for good: %s", exc)
                    said = True
                self._stop.wait(0.05)

    def all_delivered(self, within_s: float) -> bool:
        """Whether, within ``within_s``, every record produced so far is acknowledged and its
        callback (an error's) has run: the producer counts a record until then."""
        deadline = time.monotonic() + within_s
        while len(self.producer) > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    def wait_to_write(self) -> None:
        """Called by a writer that saw ``writes_open`` false: returns once the gate opens again.
        (The attribute is read without a lock: a write that slips past the gate as it shuts is
        one more record the holder waits for, never one it misses.)"""
        self._reopened.wait()

    @contextlib.contextmanager
    def writes_held(self, within_s: float) -> Iterator[None]:
        """Shut the writers' gate and send what lingers at once, waiting up to ``within_s`` for
        everything produced so far to be acknowledged; the gate opens again on leaving.

        A producer that quick handlers keep busy never holds nothing unacknowledged on its own, so
        a commit waiting for that moment (``all_delivered``, inside) would wait for ever. With the
        gate shut nothing new comes, and the flush ignores the linger: the wait is one round trip
        to the broker, the writers' pause as long. (A fatal producer error the flush raises is the
        serving thread's to report; the commit inside then finds writes unacknowledged.)
        """
        self.writes_open = False
        self._reopened.clear()
        try:
            with contextlib.suppress(KafkaException):
                self.producer.flush(within_s)
            yield
        finally:
            self.writes_open = True
            self._reopened.set()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self.producer.flush(10)
